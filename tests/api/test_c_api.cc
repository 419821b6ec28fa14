// The C ABI: status codes, dpa_last_error() naming the argument, nothing written on failure.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "dpa/c_api.h"
#include "dpa/kvcache.h"
#include "support/host_tensor.h"

extern "C" int dpa_c_forward_small(double softcap, int softmax_type, float* o_first,
                                   float* lse_first);
extern "C" int dpa_c_forward_bad_offset(float* o_first);
extern "C" int dpa_c_forward_ex_small(size_t call_size, size_t* workspace_bytes, float* o_first);
extern "C" int dpa_c_kvcache_decode(int32_t first_page, int entry, float* o, float* appended);

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

// The C call's decode equals the C++ one over the same cache, taken as contiguous sequences:
// the cached rows in table order (page 2, then page 0) and the appended token.
TEST(CApi, KvCacheDecodeFromC) {
  float o[8], appended[4];
  ASSERT_EQ(dpa_c_kvcache_decode(2, 0, o, appended), DPA_SUCCESS) << dpa_last_error();
  // The _ex entry with a default call (the default stream) gives the same outputs.
  float o_ex[8], appended_ex[4];
  ASSERT_EQ(dpa_c_kvcache_decode(2, 1, o_ex, appended_ex), DPA_SUCCESS) << dpa_last_error();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(o_ex[i], o[i]) << i;
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(appended[i], float(0.5 - 0.2 * i));

  using dpa::test::HostTensor;
  HostTensor q(dpa::DType::kFloat32, {1, 1, 2, 4}), k(dpa::DType::kFloat32, {1, 4, 1, 4}),
      v(dpa::DType::kFloat32, {1, 4, 1, 4}), out(dpa::DType::kFloat32, {1, 1, 2, 4});
  HostTensor lengths(dpa::DType::kInt32, {1});
  lengths.set(0, 4);
  for (int i = 0; i < 8; ++i) q.set(i, float(std::sin(0.9 * i)));
  const int rows[3] = {4, 5, 0};  // positions 0, 1, 2: page 2 rows 0, 1; page 0 row 0
  for (int pos = 0; pos < 3; ++pos)
    for (int e = 0; e < 4; ++e) {
      k.set(pos * 4 + e, float(std::cos(0.4 * (rows[pos] * 4 + e))));
      v.set(pos * 4 + e, float(0.05 * (rows[pos] * 4 + e)));
    }
  for (int e = 0; e < 4; ++e) {
    k.set(12 + e, float(0.5 - 0.2 * e));
    v.set(12 + e, float(1.0 + e));
  }
  dpa::KvCacheConfig config;
  config.causal = true;
  config.softcap = 2.0;
  config.backend = dpa::BackendKind::kCpuExact;
  dpa::KvCacheArgs args;
  args.q = q.view();
  args.k_cache = k.view();
  args.v_cache = v.view();
  args.cache_seqlens = lengths.view();
  args.o = out.view();
  dpa::KvCacheAttention(config).forward(args);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(o[i], float(out.get(i))) << i;
  // The cap the C config carries moves the result: a C ABI that dropped it would fail above.
  config.softcap = 0.0;
  HostTensor uncapped(dpa::DType::kFloat32, {1, 1, 2, 4});
  args.o = uncapped.view();
  dpa::KvCacheAttention(config).forward(args);
  EXPECT_GT(dpa::test::max_abs_error(uncapped, out), 1e-3);
}

TEST(CApi, KvCacheTakesAWorkspaceAndChecksIt) {
  float o[8], appended[4], o_plain[8], appended_plain[4];
  ASSERT_EQ(dpa_c_kvcache_decode(2, 0, o_plain, appended_plain), DPA_SUCCESS) << dpa_last_error();
  ASSERT_EQ(dpa_c_kvcache_decode(2, 2, o, appended), DPA_SUCCESS) << dpa_last_error();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(o[i], o_plain[i]) << i;
  // Off its boundary: refused naming the workspace, nothing written.
  EXPECT_EQ(dpa_c_kvcache_decode(2, 3, o, appended), DPA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dpa_last_error()).find("workspace"), std::string::npos) << dpa_last_error();
  for (float value : o) EXPECT_EQ(value, 777.0f);
  EXPECT_FLOAT_EQ(appended[0], float(std::cos(0.4 * 4)));  // page 0 row 1 as it was
}

TEST(CApi, KvCacheBadTableNamesItAndWritesNothing) {
  float o[8], appended[4];
  EXPECT_EQ(dpa_c_kvcache_decode(3, 0, o, appended), DPA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dpa_last_error()).find("block_table"), std::string::npos)
      << dpa_last_error();
  for (float value : o) EXPECT_EQ(value, 777.0f);
  EXPECT_FLOAT_EQ(appended[0], float(std::cos(0.4 * 4)));  // page 0 row 1 as it was
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
