// KvCacheAttention with device tensors: until the serving kernels exist (docs/kvcache.md), a
// device cache is refused with NotSupportedError naming the first device tensor, and neither the
// cache nor the output is written. When the kernels land, this test becomes the device half of
// tests/api/test_kvcache.cc.
#include <gtest/gtest.h>

#include <string>

#include "dpa/kvcache.h"
#include "gpu/device_case.h"
#include "support/kvcache_case.h"

namespace dpa::test {
namespace {

TEST(GpuKvCache, DeviceCachesAreRefusedAndNothingIsWritten) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << why;
  KvCacheCaseSpec spec;
  spec.dtype = DType::kBFloat16;
  spec.cached = {30, 7};
  spec.added = {1, 1};
  spec.queries = {1, 1};
  spec.head_dim_qk = spec.head_dim_v = 64;
  spec.page_size = 16;
  spec.config.causal = true;
  const KvCacheCase c = make_kvcache_case(spec);
  const DeviceTensor q(c.q), k_cache(c.k_cache), v_cache(c.v_cache), k_new(c.k_new), v_new(c.v_new),
      table(c.block_table), seqlens(c.cache_seqlens);
  DeviceTensor o(spec.dtype, {2, 1, spec.heads_q, spec.head_dim_v});
  const HostTensor o_before = o.download();
  KvCacheArgs args;
  args.q = q.view();
  args.k_cache = k_cache.view();
  args.v_cache = v_cache.view();
  args.k_new = k_new.view();
  args.v_new = v_new.view();
  args.block_table = table.view();
  args.cache_seqlens = seqlens.view();
  args.o = o.view();
  try {
    KvCacheAttention(spec.config).forward(args);
    FAIL() << "a device cache ran";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kNotSupported) << error.what();
    EXPECT_EQ(error.argument(), "q") << error.what();
  }
  EXPECT_EQ(max_abs_error(k_cache.download(), c.k_cache), 0.0);
  EXPECT_EQ(max_abs_error(o.download(), o_before), 0.0);
}

}  // namespace
}  // namespace dpa::test
