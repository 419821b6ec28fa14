// cuda_flash forward against cpu_exact on every configuration it takes (gpu_cases.cc), and
// what its selection rules promise: no backward yet, no arbitrary mask or bias, chosen for
// decode shapes, deterministic results.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "gpu/device_case.h"
#include "gpu/gpu_cases.h"

namespace dpa::test {
namespace {

void skip_without_gpu() {
  std::string why;
  if (!gpu_present(&why) && !reference_only_mode()) GTEST_SKIP() << why;
}

class FlashForward : public ::testing::TestWithParam<GpuCase> {
 protected:
  void SetUp() override { skip_without_gpu(); }
};

TEST_P(FlashForward, MatchesExact) {
  check_case_on_backend(GetParam(), BackendKind::kCudaFlash, /*backward=*/false);
}

INSTANTIATE_TEST_SUITE_P(Cases, FlashForward, ::testing::ValuesIn(flash_cases()),
                         [](const ::testing::TestParamInfo<GpuCase>& info) {
                           return info.param.name;
                         });

// Shapes only (null data on the device): what explain() sees.
AttentionInputs device_shapes(int64_t b, int64_t sq, int64_t skv, int64_t heads_q, int64_t heads_kv,
                              int64_t d) {
  AttentionInputs in;
  in.q = TensorView::contiguous(nullptr, DType::kBFloat16, {b, sq, heads_q, d}, Device::kCUDA);
  in.k = TensorView::contiguous(nullptr, DType::kBFloat16, {b, skv, heads_kv, d}, Device::kCUDA);
  in.v = in.k;
  return in;
}

const BackendVerdict* verdict_for(const Selection& selection, BackendKind backend) {
  for (const BackendVerdict& verdict : selection.verdicts)
    if (verdict.backend == backend) return &verdict;
  return nullptr;
}

bool has_reason_containing(const BackendVerdict& verdict, const std::string& word) {
  for (const std::string& reason : verdict.reasons)
    if (reason.find(word) != std::string::npos) return true;
  return false;
}

// cuda_flash has no backward yet: the selector must refuse it with a reason instead of letting
// a call fail later (DESIGN.md §6). Needs no GPU: explain() reads shapes only.
TEST(FlashSelection, RefusesBackwardWithAReason) {
  AttentionConfig config;
  config.backend = BackendKind::kCudaFlash;
  DotProductAttention attention(config);
  const Selection selection =
      attention.explain(device_shapes(2, 128, 128, 8, 2, 128), Pass::kBackward);
  EXPECT_FALSE(selection.chosen.has_value()) << selection.to_string();
  const BackendVerdict* flash = verdict_for(selection, BackendKind::kCudaFlash);
  ASSERT_NE(flash, nullptr) << selection.to_string();
  EXPECT_FALSE(flash->eligible);
  EXPECT_TRUE(has_reason_containing(*flash, "backward")) << selection.to_string();
}

TEST(FlashSelection, RefusesArbitraryMaskWithAReason) {
  AttentionConfig config;
  config.mask_type = MaskType::kArbitrary;
  DotProductAttention attention(config);
  AttentionInputs in = device_shapes(2, 128, 128, 8, 2, 128);
  in.attn_mask = TensorView::contiguous(nullptr, DType::kBool, {1, 1, 128, 128}, Device::kCUDA);
  const Selection selection = attention.explain(in, Pass::kForward);
  const BackendVerdict* flash = verdict_for(selection, BackendKind::kCudaFlash);
  ASSERT_NE(flash, nullptr) << selection.to_string();
  EXPECT_FALSE(flash->eligible);
  EXPECT_FALSE(flash->reasons.empty());
  EXPECT_NE(selection.chosen, BackendKind::kCudaFlash);
}

class FlashOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
  }
};

// The selector prefers cuda_flash for GPU tensors wherever it is eligible, decode included.
TEST_F(FlashOnGpu, ChosenAutomaticallyForDecode) {
  DotProductAttention attention(AttentionConfig{});
  const Selection selection =
      attention.explain(device_shapes(2, 1, 32768, 64, 8, 128), Pass::kForward);
  EXPECT_EQ(selection.chosen, BackendKind::kCudaFlash) << selection.to_string();
}

GpuCase find_case(const std::string& name) {
  for (const GpuCase& c : gpu_cases())
    if (c.name == name) return c;
  ADD_FAILURE() << "no case " << name;
  return {};
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.view().data, b.view().data, size_t(a.numel()) * dtype_size(a.dtype())) == 0;
}

// The split-KV merge runs in a fixed order and nothing uses atomics: two runs agree to the bit
// (cuda_flash declares itself deterministic).
TEST_F(FlashOnGpu, DecodeIsBitwiseDeterministic) {
  const GpuCase c = find_case("decode_gqa_64_8_sink");
  const CaseSpec spec = gpu_case_spec(c);
  const CaseTensors& tensors = gpu_case_tensors(c);
  const CaseOutputs first = run_device_case(spec, tensors, BackendKind::kCudaFlash, false);
  const CaseOutputs second = run_device_case(spec, tensors, BackendKind::kCudaFlash, false);
  EXPECT_TRUE(same_bytes(first.o, second.o));
  EXPECT_TRUE(same_bytes(first.lse, second.lse));
}

// Automatic selection end to end: forward on cuda_flash, backward on cuda_unfused (the only
// GPU backward), gradients from the flash forward's o and LSE.
TEST_F(FlashOnGpu, AutoSelectionRunsFlashForwardAndUnfusedBackward) {
  const GpuCase c = find_case("sink_learnable_softcap_causal");
  const CaseSpec spec = gpu_case_spec(c);
  const CaseTensors& tensors = gpu_case_tensors(c);
  const CaseOutputs& reference = exact_reference(c.name, spec, tensors, true);
  const CaseOutputs got = run_device_case(spec, tensors, BackendKind::kAuto, true);
  EXPECT_EQ(got.forward_backend, BackendKind::kCudaFlash);
  EXPECT_EQ(got.backward_backend, BackendKind::kCudaUnfused);
  expect_matches_reference(got, reference, spec.dtype, true, "auto selection");
}

}  // namespace
}  // namespace dpa::test
