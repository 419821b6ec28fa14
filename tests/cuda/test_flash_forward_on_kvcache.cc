// Which forward requests cuda_flash runs on the KV-cache kernel (cuda/flash/
// flash_forward_on_kvcache.h): decode-like ones that the kernel computes exactly as the flash
// forward would. Each condition is flipped on its own from an accepted request; no GPU needed.
#include <gtest/gtest.h>

#include <cstddef>

#include "core/backend.h"
#include "cuda/flash/flash_forward_on_kvcache.h"
#include "cuda/kvcache/kvcache_launch.h"

namespace dpa {
namespace {

constexpr size_t kHopperSharedBytes = 227 * 1024;

// gpt-oss decode: one query against 32k keys, GQA 64/8, d = 64, a window and a sink.
FeatureRequest decode_request() {
  FeatureRequest r;
  r.device = Device::kCUDA;
  r.dtype = DType::kBFloat16;
  r.device_arch = 90;
  r.batch = 4;
  r.heads_q = 64;
  r.heads_kv = 8;
  r.max_seqlen_q = 1;
  r.max_seqlen_kv = 32768;
  r.head_dim_qk = r.head_dim_v = 64;
  r.mask_type = MaskType::kCausalBottomRight;
  r.window = true;
  r.softmax_type = SoftmaxType::kLearnable;
  r.softcap = true;
  r.alibi = true;
  return r;
}

bool on_kvcache(const FeatureRequest& r) {
  return cuda::forward_runs_on_kvcache_kernel(r, kHopperSharedBytes);
}

TEST(FlashForwardOnKvCache, TakesDecodeWithEveryFeatureTheKernelHas) {
  FeatureRequest r = decode_request();
  EXPECT_TRUE(on_kvcache(r));
  r.max_seqlen_q = 16;  // up to the flash forward's decode tiles' rows
  EXPECT_TRUE(on_kvcache(r));
  r.format = Format::kSBHD;  // strides, not the dimension order, locate rows
  EXPECT_TRUE(on_kvcache(r));
  for (int64_t d : {128, 256}) {
    r.head_dim_qk = r.head_dim_v = d;
    EXPECT_TRUE(on_kvcache(r)) << d;
  }
  r.dtype = DType::kFloat16;
  EXPECT_TRUE(on_kvcache(r));
  // Keys fewer than k's rows (padding or cu_seqlens): a contiguous cache's ragged lengths.
  r.mask_type = MaskType::kPaddingCausalBottomRight;
  r.keys_fill_rows = false;
  EXPECT_TRUE(on_kvcache(r));
}

TEST(FlashForwardOnKvCache, LeavesEverythingElseToTheFlashForward) {
  const auto refused = [](void (*change)(FeatureRequest&)) {
    FeatureRequest r = decode_request();
    change(r);
    return !on_kvcache(r);
  };
  EXPECT_TRUE(refused([](FeatureRequest& r) { r.max_seqlen_q = 17; }));
  EXPECT_TRUE(refused([](FeatureRequest& r) { r.pass = Pass::kBackward; }));
  EXPECT_TRUE(refused([](FeatureRequest& r) { r.device = Device::kCPU; }));
  EXPECT_TRUE(refused([](FeatureRequest& r) { r.format = Format::kTHD; }));
  // A sequence shorter than its tensor's rows (padding, or cu_seqlens with any mask).
  EXPECT_TRUE(refused([](FeatureRequest& r) { r.queries_fill_rows = false; }));
  EXPECT_TRUE(refused([](FeatureRequest& r) { r.dropout = true; }));
  EXPECT_TRUE(refused([](FeatureRequest& r) { r.bias_type = BiasType::kPostScale; }));
  EXPECT_TRUE(refused([](FeatureRequest& r) { r.cp.tile = true; }));
  EXPECT_TRUE(refused([](FeatureRequest& r) { r.dtype = DType::kFloat32; }));
  EXPECT_TRUE(refused([](FeatureRequest& r) { r.head_dim_qk = r.head_dim_v = 96; }));
  EXPECT_TRUE(refused([](FeatureRequest& r) {
    r.head_dim_qk = 192;
    r.head_dim_v = 128;
  }));
  EXPECT_TRUE(refused([](FeatureRequest& r) { r.rows_16_byte_aligned = false; }));
  // A family the config asks for is the one that runs (tests and benches pin it).
  EXPECT_TRUE(
      refused([](FeatureRequest& r) { r.flash_forward_kernel = FlashForwardKernel::kMmaSync; }));
}

// The kernel places query i of sq at key i + skv - sq. A top-left diagonal (kCausal, or a
// window or ALiBi placed top-left) differs unless sq = skv, and only a causal mask, a window or
// ALiBi read it.
TEST(FlashForwardOnKvCache, TakesATopLeftDiagonalOnlyWhereNothingReadsItOrItIsTheSame) {
  FeatureRequest r = decode_request();
  r.mask_type = MaskType::kCausal;
  r.bottom_right = false;
  EXPECT_FALSE(on_kvcache(r));
  r.window = false;
  r.alibi = false;
  EXPECT_FALSE(on_kvcache(r));  // the causal mask alone
  r.mask_type = MaskType::kNoMask;
  EXPECT_TRUE(on_kvcache(r));
  r.alibi = true;
  EXPECT_FALSE(on_kvcache(r));
  r.alibi = false;
  r.mask_type = MaskType::kCausal;
  r.max_seqlen_q = r.max_seqlen_kv = 12;
  EXPECT_TRUE(on_kvcache(r));
  // Shorter key sequences: equal maxima say nothing of each sequence's lengths.
  r.keys_fill_rows = false;
  EXPECT_FALSE(on_kvcache(r));
}

// Head dim 256's tiles take more shared memory than sm_86 / sm_89 give a block (99 KB): those
// devices keep the flash forward's decode tiles.
TEST(FlashForwardOnKvCache, NeedsItsTilesToFitTheDevice) {
  FeatureRequest r = decode_request();
  r.head_dim_qk = r.head_dim_v = 256;
  const size_t need = size_t(cuda::kvcache_shared_bytes(256, cuda::kvcache_default_stages(256)));
  EXPECT_TRUE(cuda::forward_runs_on_kvcache_kernel(r, need));
  EXPECT_FALSE(cuda::forward_runs_on_kvcache_kernel(r, need - 1));
  EXPECT_FALSE(cuda::forward_runs_on_kvcache_kernel(r, 99 * 1024));
}

}  // namespace
}  // namespace dpa
