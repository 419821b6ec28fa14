// The GPU suite's main: the tests force backends through AttentionConfig::backend, which the
// DPA_BACKEND environment variable would override, so it is cleared first.
#include <gtest/gtest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  unsetenv("DPA_BACKEND");
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
