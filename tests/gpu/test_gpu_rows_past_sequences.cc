// Rows of k and v past a sequence but inside its tensor (bshd padding, the gaps of thd's padded
// offsets) are not part of the problem: cuda_flash's forward must never let them reach o, even
// when they are NaN. Its TMA copies take whole key tiles, so a tile that crosses a sequence's
// end is copied with cp.async and zero-filled instead (FlashForwardParams::tma_tails); a TMA
// copy there would multiply a masked key's P = 0 by NaN. The suite's other cases fill those rows
// with finite random values, where such a read goes unseen.
#include <gtest/gtest.h>

#include <string>

#include "gpu/device_case.h"
#include "gpu/gpu_cases.h"

namespace dpa::test {
namespace {

CaseSpec padded_bshd_d128() {
  CaseSpec spec;
  spec.dtype = DType::kBFloat16;
  spec.batch = 3;
  spec.seqlen_q = 150;
  spec.seqlen_kv = 400;
  spec.heads_q = 4;
  spec.heads_kv = 2;
  spec.head_dim_qk = spec.head_dim_v = 128;
  spec.config.mask_type = MaskType::kPaddingCausalBottomRight;
  // A full tile then a tail; a tail only; whole tiles only (no tail), then padding.
  spec.lengths_q = {150, 33, 128};
  spec.lengths_kv = {200, 90, 256};
  return spec;
}

class FlashRowsPastSequences : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why) && !reference_only_mode()) GTEST_SKIP() << why;
  }
};

TEST_P(FlashRowsPastSequences, NanThereNeverReachesO) {
  CaseSpec spec;
  CaseTensors tensors;
  if (GetParam() == "padded_bshd_d128") {
    spec = padded_bshd_d128();
    tensors = make_case(spec);
  } else if (GetParam() == "padded_bshd_d128_softcap") {
    // The softcap's shared reciprocals (fully visible tiles only): NaN keys past a sequence
    // must not reach the keys beside them. A cap of 1 on unscaled logits (|q.k| ~ 11) bends
    // them all; bf16 takes the fixed max (caps up to 50).
    spec = padded_bshd_d128();
    spec.config.softcap = 1.0;
    spec.config.scale = 1.0;
    tensors = make_case(spec);
    ASSERT_GT(softcap_moves_o(spec, tensors), 10.0 * output_tolerance(spec.dtype))
        << "the cap must move the reference";
  } else {
    for (const GpuCase& c : gpu_cases())
      if (c.name == GetParam()) {
        spec = gpu_case_spec(c);
        tensors = make_gpu_case_tensors(c, spec);
      }
    ASSERT_TRUE(tensors.k.defined()) << "no case " << GetParam();
  }
  const CaseOutputs clean = run_case(spec, tensors, BackendKind::kCpuExact, /*backward=*/false);
  ASSERT_GT(poison_rows_past_sequences(spec, tensors), 0) << "the case has no such rows";
  if (spec.config.format == Format::kBSHD) {
    ASSERT_TRUE(poison_reaches_o_without_the_lengths(spec, tensors));
  }
  // The truth never reads them: the poisoned inputs give the same o and LSE, without NaN.
  const CaseOutputs reference = run_case(spec, tensors, BackendKind::kCpuExact, /*backward=*/false);
  ASSERT_FALSE(has_nan(reference.o));
  ASSERT_EQ(max_abs_error(reference.o, clean.o), 0.0);
  ASSERT_EQ(max_abs_error(reference.lse, clean.lse), 0.0);
  if (reference_only_mode()) GTEST_SKIP() << "reference only";

  const CaseOutputs got = run_device_case(spec, tensors, BackendKind::kCudaFlash, false);
  EXPECT_EQ(got.forward_backend, BackendKind::kCudaFlash);
  expect_matches_reference(got, reference, spec.dtype, /*backward=*/false,
                           GetParam() + " with NaN past its sequences");
}

INSTANTIATE_TEST_SUITE_P(Cases, FlashRowsPastSequences,
                         ::testing::Values("padded_bshd_d128", "padded_bshd_d128_softcap",
                                           "padding_causal", "thd_padded_offsets_causal",
                                           "thd_window", "hdim256_thd_alibi"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace dpa::test
