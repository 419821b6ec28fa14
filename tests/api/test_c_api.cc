// The C ABI: status codes, dpa_last_error() naming the argument, nothing written on failure.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "dpa/c_api.h"

extern "C" int dpa_c_forward_small(double softcap, int softmax_type, float* o_first,
                                   float* lse_first);
extern "C" int dpa_c_forward_bad_offset(float* o_first);
extern "C" int dpa_c_forward_ex_small(size_t call_size, size_t* workspace_bytes, float* o_first);

namespace {

TEST(CApi, ForwardFromC) {
  float o = 0, lse = 0;
  ASSERT_EQ(dpa_c_forward_small(0.5, DPA_SOFTMAX_OFF_BY_ONE, &o, &lse), DPA_SUCCESS)
      << dpa_last_error();
  EXPECT_NE(o, 777.0f);
  EXPECT_TRUE(std::isfinite(lse));
  float o_uncapped = 0, lse_uncapped = 0;
  ASSERT_EQ(dpa_c_forward_small(0.0, DPA_SOFTMAX_OFF_BY_ONE, &o_uncapped, &lse_uncapped),
            DPA_SUCCESS);
  EXPECT_NE(lse, lse_uncapped) << "the cap must reach the backend through the C config";
}

TEST(CApi, BadSoftcapNamesArgument) {
  float o = 0, lse = 0;
  EXPECT_EQ(dpa_c_forward_small(-1.0, DPA_SOFTMAX_VANILLA, &o, &lse), DPA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dpa_last_error()).find("softcap"), std::string::npos) << dpa_last_error();
}

TEST(CApi, BadOffsetWritesNothing) {
  float o = 0;
  EXPECT_EQ(dpa_c_forward_bad_offset(&o), DPA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dpa_last_error()).find("softmax_offset"), std::string::npos)
      << dpa_last_error();
  EXPECT_EQ(o, 777.0f);
}

TEST(CApi, ForwardExOnACallStruct) {
  size_t workspace_bytes = 123;
  float o = 0;
  ASSERT_EQ(dpa_c_forward_ex_small(sizeof(dpa_call_t), &workspace_bytes, &o), DPA_SUCCESS)
      << dpa_last_error();
  EXPECT_EQ(workspace_bytes, 0u) << "host backends need no device workspace";
  EXPECT_NE(o, 777.0f);
}

TEST(CApi, ForwardExChecksTheCallStructAndWritesNothing) {
  size_t workspace_bytes = 0;
  float o = 0;
  EXPECT_EQ(dpa_c_forward_ex_small(sizeof(dpa_call_t) - 1, &workspace_bytes, &o),
            DPA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dpa_last_error()).find("call"), std::string::npos) << dpa_last_error();
  EXPECT_EQ(o, 777.0f);
}

TEST(CApi, NullArgumentsAreErrors) {
  dpa_attention_t attention = nullptr;
  EXPECT_EQ(dpa_attention_create(nullptr, &attention), DPA_INVALID_ARGUMENT);
  dpa_config_t config = DPA_CONFIG_INITIALIZER;
  config.version = 99;
  EXPECT_EQ(dpa_attention_create(&config, &attention), DPA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dpa_last_error()).find("config"), std::string::npos);
  dpa_tensor_t none{};
  EXPECT_EQ(dpa_attention_forward(nullptr, nullptr, none, none, nullptr, nullptr),
            DPA_INVALID_ARGUMENT);
  EXPECT_STREQ(dpa_status_string(DPA_NOT_SUPPORTED), "not supported");
}

}  // namespace
