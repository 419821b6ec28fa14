// cuda_flash on drawn calls (a fixed seed): the named cases of gpu_cases.cc pin one shape and
// feature set each; these draw the shape (head dims of every compiled pair, ragged lengths that
// are no multiple of any tile, bshd, sbhd and thd with padded offsets, GQA ratios) and the
// features (masks of both diagonals, windows, softcap, sinks, ALiBi, dropout, deterministic
// mode) independently, forward and backward, against cpu_exact on the same rounded inputs with
// the suite's tolerances. Every draw is one cuda_flash takes (no bias, no arbitrary mask); a
// refusal of one is a failure. The draws keep every row seeing several keys, so that no
// gradient is zero by cancellation (a relative norm of a zero reference reads as infinite).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu/device_case.h"
#include "support/attention_case.h"

namespace dpa::test {
namespace {

constexpr int kDraws = 40;

struct Draw {
  CaseSpec spec;
  std::string what;
};

Draw draw_call(std::mt19937& rng, int index) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Draw d;
  CaseSpec& s = d.spec;
  s.seed = uint64_t(7000 + index);
  s.dtype = pick(0, 1) ? DType::kBFloat16 : DType::kFloat16;
  const std::pair<int, int> dims[] = {{64, 64},   {96, 96},   {128, 128},
                                      {192, 192}, {192, 128}, {256, 256}};
  const auto [dqk, dv] = dims[pick(0, 5)];
  s.head_dim_qk = dqk;
  s.head_dim_v = dv;
  s.heads_kv = 1 << pick(0, 1);
  s.heads_q = s.heads_kv * (1 << pick(0, 2));
  const int layout = pick(0, 3);  // bshd, bshd with lengths, sbhd, thd
  const bool causal = pick(0, 1) == 1;
  const bool bottom_right = pick(0, 1) == 1;
  if (layout == 3) {
    s.config.format = Format::kTHD;
    const int sequences = pick(1, 3);
    for (int b = 0; b < sequences; ++b) {
      s.lengths_q.push_back(pick(8, 150));
      s.lengths_kv.push_back(pick(8, 180));
      s.gaps_q.push_back(pick(0, 1) ? pick(1, 9) : 0);
      s.gaps_kv.push_back(pick(0, 1) ? pick(1, 9) : 0);
    }
    s.config.mask_type =
        causal ? (bottom_right ? MaskType::kPaddingCausalBottomRight : MaskType::kPaddingCausal)
               : MaskType::kPadding;
  } else {
    if (layout == 2) s.config.format = Format::kSBHD;
    s.batch = pick(1, 2);
    s.seqlen_q = pick(8, 200);
    s.seqlen_kv = pick(8, 220);
    if (layout == 1) {
      for (int64_t b = 0; b < s.batch; ++b) {
        s.lengths_q.push_back(pick(8, int(s.seqlen_q)));
        s.lengths_kv.push_back(pick(8, int(s.seqlen_kv)));
      }
      s.config.mask_type =
          causal ? (bottom_right ? MaskType::kPaddingCausalBottomRight : MaskType::kPaddingCausal)
                 : MaskType::kPadding;
    } else {
      s.config.mask_type = causal
                               ? (bottom_right ? MaskType::kCausalBottomRight : MaskType::kCausal)
                               : MaskType::kNoMask;
    }
  }
  if (pick(0, 2) == 0) {  // a window of at least 8 keys on the left
    s.config.window_left = pick(8, 120);
    s.config.window_right = causal ? 0 : pick(0, 40);
    if (!causal) s.config.bottom_right_diagonal = bottom_right;
  }
  if (pick(0, 2) == 0) {
    s.config.softcap = pick(0, 1) ? 20.0 : 50.0;
    s.qk_stddev = 2.0;  // logits that reach the cap's bend
  }
  const int softmax = pick(0, 2);
  s.config.softmax_type = softmax == 0   ? SoftmaxType::kVanilla
                          : softmax == 1 ? SoftmaxType::kOffByOne
                                         : SoftmaxType::kLearnable;
  s.alibi = pick(0, 4) == 0;
  if (pick(0, 4) == 0) {
    s.config.dropout = 0.1;
    s.config.seed = uint64_t(31 + index);
  }
  s.config.deterministic = pick(0, 3) == 0;
  d.what = "draw " + std::to_string(index) + ": " + std::string(to_string(s.dtype)) + " dims " +
           std::to_string(dqk) + "/" + std::to_string(dv) + " heads " + std::to_string(s.heads_q) +
           "/" + std::to_string(s.heads_kv) + " layout " + std::to_string(layout) + " mask " +
           std::string(to_string(s.config.mask_type)) + " window (" +
           std::to_string(s.config.window_left) + ", " + std::to_string(s.config.window_right) +
           ") softcap " + std::to_string(int(s.config.softcap)) + " softmax " +
           std::to_string(softmax) + (s.alibi ? " alibi" : "") +
           (s.config.dropout > 0 ? " dropout" : "") +
           (s.config.deterministic ? " deterministic" : "");
  return d;
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
  for (int index = 0; index < kDraws; ++index) {
    const Draw d = draw_call(rng, index);
    const CaseTensors tensors = make_case(d.spec);
    const CaseOutputs& reference =
        exact_reference("randomized_" + std::to_string(index), d.spec, tensors, true);
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
