// The visibility rules of core/attention_math.h that the benches' FLOP counts share
// (DESIGN.md §3, §10): visible_pairs against closed forms and a brute-force count.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/attention_math.h"

namespace dpa {
namespace {

// Brute force over every (i, j): j visible when window_left / window_right around i + diagonal
// allow it (-1 unbounded) and j is a key of the sequence.
int64_t count_by_hand(int64_t sq, int64_t skv, int64_t diagonal, int64_t left, int64_t right) {
  int64_t pairs = 0;
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 0; j < skv; ++j) {
      const int64_t center = i + diagonal;
      if ((left < 0 || j >= center - left) && (right < 0 || j <= center + right)) ++pairs;
    }
  return pairs;
}

TEST(VisiblePairs, ClosedForms) {
  EXPECT_EQ(visible_pairs(7, 11, 0, -1, -1), 77);           // no mask
  EXPECT_EQ(visible_pairs(9, 9, 0, -1, 0), 9 * 10 / 2);     // causal, top-left
  EXPECT_EQ(visible_pairs(4, 9, 5, -1, 0), 6 + 7 + 8 + 9);  // causal, bottom-right
  EXPECT_EQ(visible_pairs(0, 9, 0, -1, -1), 0);
  EXPECT_EQ(visible_pairs(5, 0, 0, -1, -1), 0);
  // gpt-oss: causal window (w - 1, 0) of w = 4 over 10 positions: 1 + 2 + 3 + 4 * 7.
  EXPECT_EQ(visible_pairs(10, 10, 0, 3, 0), 1 + 2 + 3 + 4 * 7);
}

TEST(VisiblePairs, MatchesABruteForceCount) {
  for (int64_t sq : {1, 5, 13})
    for (int64_t skv : {1, 6, 17})
      for (int64_t diagonal : {int64_t(0), skv - sq, int64_t(3)})
        for (int64_t left : {-1, 0, 2, 7})
          for (int64_t right : {-1, 0, 1, 4})
            ASSERT_EQ(visible_pairs(sq, skv, diagonal, left, right),
                      count_by_hand(sq, skv, diagonal, left, right))
                << sq << " " << skv << " " << diagonal << " " << left << " " << right;
}

TEST(VisiblePairs, HugeWindowsDoNotOverflow) {
  EXPECT_EQ(visible_pairs(8, 8, 0, INT64_MAX, INT64_MAX), 64);
  EXPECT_EQ(visible_pairs(8, 8, 0, -1, INT64_MAX - 1), 64);
}

}  // namespace
}  // namespace dpa
