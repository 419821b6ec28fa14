// What cuda_flash's selection rules promise beyond the CP ones (test_cuda_cp_rules.cc): rows
// must be 16-byte aligned, and its fused backward runs only when opted in until validated.
// Checked through the selector on the real capabilities; no GPU needed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/problem_builder.h"
#include "core/selector.h"
#include "dpa/attention.h"

namespace dpa {
namespace {

const Capabilities& flash_capabilities() {
  for (const Backend* backend : registered_backends())
    if (backend->capabilities().kind == BackendKind::kCudaFlash) return backend->capabilities();
  throw std::runtime_error("cuda_flash not registered");
}

bool refused_for(const FeatureRequest& request, const std::string& words) {
  const Selection selection =
      select_backend(request, {&flash_capabilities()}, BackendKind::kCudaFlash);
  for (const BackendVerdict& verdict : selection.verdicts)
    for (const std::string& reason : verdict.reasons)
      if (reason.find(words) != std::string::npos) return true;
  return false;
}

FeatureRequest gpu_request() {
  FeatureRequest r;
  r.device = Device::kCUDA;
  r.dtype = DType::kBFloat16;
  r.head_dim_qk = r.head_dim_v = 128;
  r.device_arch = 90;
  return r;
}

TEST(FlashRules, RefusesRowsThatAreNot16ByteAligned) {
  FeatureRequest r = gpu_request();
  EXPECT_FALSE(refused_for(r, "16-byte"));
  r.rows_16_byte_aligned = false;
  EXPECT_TRUE(refused_for(r, "16-byte"));
}

// The request's alignment fact comes from the problem: a q whose rows sit 2 bytes apart from
// 16-byte boundaries (a view one element into a buffer) is reported unaligned.
TEST(FlashRules, FeatureRequestSeesMisalignedRows) {
  std::vector<uint16_t> storage(2 * 4 * 2 * 64 + 8);
  auto view = [&](size_t first) {
    return TensorView::contiguous(storage.data() + first, DType::kBFloat16, {2, 4, 2, 64});
  };
  std::vector<float> lse(2 * 2 * 4);
  std::vector<uint16_t> o(2 * 4 * 2 * 64);
  ForwardArgs args;
  args.in.q = view(0);
  args.in.k = view(0);
  args.in.v = view(0);
  args.o = TensorView::contiguous(o.data(), DType::kBFloat16, {2, 4, 2, 64});
  args.lse = TensorView::contiguous(lse.data(), DType::kFloat32, {2, 2, 4});
  AttentionConfig config;
  const bool aligned = reinterpret_cast<uintptr_t>(storage.data()) % 16 == 0;
  if (aligned) {
    EXPECT_TRUE(
        make_feature_request(build_forward_problem(config, args, 0.0, {})).rows_16_byte_aligned);
  }
  args.in.q = view(1);
  EXPECT_FALSE(
      make_feature_request(build_forward_problem(config, args, 0.0, {})).rows_16_byte_aligned);
}

}  // namespace
}  // namespace dpa
