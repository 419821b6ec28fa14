// cuda_unfused forward and backward against cpu_exact on every configuration (gpu_cases.cc),
// arbitrary masks and bias gradients included, and its O(s^2) memory rule.
#include <gtest/gtest.h>

#include <string>

#include "gpu/device_case.h"
#include "gpu/gpu_cases.h"

namespace dpa::test {
namespace {

class UnfusedForwardBackward : public ::testing::TestWithParam<GpuCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why) && !reference_only_mode()) GTEST_SKIP() << why;
  }
};

TEST_P(UnfusedForwardBackward, MatchesExact) {
  check_case_on_backend(GetParam(), BackendKind::kCudaUnfused, /*backward=*/true);
}

INSTANTIATE_TEST_SUITE_P(Cases, UnfusedForwardBackward, ::testing::ValuesIn(unfused_cases()),
                         [](const ::testing::TestParamInfo<GpuCase>& info) {
                           return info.param.name;
                         });

class UnfusedOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
  }
};

// Its score matrices are O(b H sq skv): a size that cannot fit must be refused by the selector
// with a reason, not fail inside the backend.
TEST_F(UnfusedOnGpu, RefusesScoreMatricesThatCannotFit) {
  AttentionConfig config;
  config.backend = BackendKind::kCudaUnfused;
  DotProductAttention attention(config);
  AttentionInputs in;
  // 64 * 64 * 65536^2 fp32 scores: 70 PB.
  in.q = TensorView::contiguous(nullptr, DType::kBFloat16, {64, 65536, 64, 128}, Device::kCUDA);
  in.k = TensorView::contiguous(nullptr, DType::kBFloat16, {64, 65536, 8, 128}, Device::kCUDA);
  in.v = in.k;
  const Selection selection = attention.explain(in, Pass::kForward);
  EXPECT_FALSE(selection.chosen.has_value()) << selection.to_string();
  bool found = false;
  for (const BackendVerdict& verdict : selection.verdicts)
    if (verdict.backend == BackendKind::kCudaUnfused) {
      found = true;
      EXPECT_FALSE(verdict.eligible);
      // Beyond "not the forced backend": a reason of its own.
      EXPECT_FALSE(verdict.reasons.empty()) << selection.to_string();
    }
  EXPECT_TRUE(found) << selection.to_string();
}

}  // namespace
}  // namespace dpa::test
