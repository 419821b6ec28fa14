// cuda_flash on drawn calls (a fixed seed, support/drawn_case.h): the named cases of
// gpu_cases.cc pin one shape and feature set each; these draw the shape (head dims of every
// compiled pair, ragged lengths that are no multiple of any tile, bshd, sbhd and thd with padded
// offsets, cross attention, GQA ratios) and the features (masks of both diagonals, windows,
// softcap, sinks, ALiBi, dropout, deterministic mode) independently, forward and backward,
// against cpu_exact on the same rounded inputs with the suite's tolerances. Every draw is one
// cuda_flash takes (no bias, no arbitrary mask); a refusal of one is a failure.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "gpu/device_case.h"
#include "support/attention_case.h"
#include "support/drawn_case.h"

namespace dpa::test {
namespace {

constexpr int kDraws = 40;

// cuda_flash's ranges: every compiled head-dim pair, both 16-bit dtypes, rows of 8-220 (no
// multiple of any tile), no bias or arbitrary mask (cuda_unfused's), deterministic mode too.
DrawRanges flash_ranges() {
  DrawRanges r;
  r.dtypes = {DType::kBFloat16, DType::kFloat16};
  r.head_dims = {{64, 64}, {96, 96}, {128, 128}, {192, 192}, {192, 128}, {256, 256}};
  r.min_rows = 8;
  r.max_rows = 200;
  r.max_thd_rows = 150;
  r.biases = false;
  r.arbitrary_masks = false;
  r.deterministic = true;
  return r;
}

class FlashRandomized : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why) && !reference_only_mode()) GTEST_SKIP() << why;
  }
};

TEST_F(FlashRandomized, MatchesExactOnDrawnCalls) {
  std::mt19937 rng(20261204);
  const DrawRanges ranges = flash_ranges();
  for (int index = 0; index < kDraws; ++index) {
    const DrawnCase d = draw_case(rng, ranges, index);
    const CaseTensors tensors = make_case(d.spec);
    // A named key: GCC 13 takes a reference bound to a call with a temporary argument for a
    // dangling one (-Wdangling-reference), though exact_reference returns its cache's entry.
    const std::string key = "randomized_" + std::to_string(index);
    const CaseOutputs& reference = exact_reference(key, d.spec, tensors, true);
    if (reference_only_mode()) continue;
    try {
      const CaseOutputs got = run_device_case(d.spec, tensors, BackendKind::kCudaFlash, true);
      EXPECT_EQ(got.forward_backend, BackendKind::kCudaFlash) << d.what;
      expect_matches_reference(got, reference, d.spec.dtype, true, d.what);
    } catch (const Error& error) {
      ADD_FAILURE() << d.what << ": " << error.what();
    }
  }
  if (reference_only_mode()) GTEST_SKIP() << "reference-only mode: references computed";
}

}  // namespace
}  // namespace dpa::test
