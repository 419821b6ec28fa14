// Rows of k and v outside every sequence (bshd padding, the gaps of thd's padded offsets) may
// hold anything, NaN included (docs/decisions.md): the host backends give the same o, LSE and
// gradients, to the bit, whether those rows are NaN or finite. (GPU: FlashRowsPastSequences.)
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "support/attention_case.h"

namespace dpa::test {
namespace {

CaseSpec padded_bshd() {
  CaseSpec spec;
  spec.batch = 3;
  spec.seqlen_q = 9;
  spec.seqlen_kv = 13;
  spec.config.mask_type = MaskType::kPaddingCausalBottomRight;
  spec.lengths_q = {9, 4, 6};
  spec.lengths_kv = {13, 5, 2};
  return spec;
}

CaseSpec thd_with_gaps() {
  CaseSpec spec;
  spec.config.format = Format::kTHD;
  spec.config.mask_type = MaskType::kPaddingCausal;
  spec.config.softmax_type = SoftmaxType::kLearnable;
  spec.lengths_q = {5, 0, 7};
  spec.lengths_kv = {6, 3, 9};
  spec.gaps_q = {2, 1, 0};
  spec.gaps_kv = {3, 0, 2};
  return spec;
}

void expect_same(const HostTensor& got, const HostTensor& want, const std::string& what) {
  if (!want.defined()) return;
  EXPECT_FALSE(has_nan(got)) << what;
  EXPECT_EQ(max_abs_error(got, want), 0.0) << what;
}

class RowsPastSequences : public ::testing::TestWithParam<std::tuple<std::string, BackendKind>> {};

TEST_P(RowsPastSequences, NanThereChangesNothing) {
  const auto& [name, backend] = GetParam();
  const CaseSpec spec = name == "padded_bshd" ? padded_bshd() : thd_with_gaps();
  CaseTensors tensors = make_case(spec);
  const CaseOutputs clean = run_case(spec, tensors, backend, /*backward=*/true);
  ASSERT_GT(poison_rows_past_sequences(spec, tensors), 0) << "the case has no such rows";
  if (spec.config.format == Format::kBSHD) {
    ASSERT_TRUE(poison_reaches_o_without_the_lengths(spec, tensors));
  }
  const CaseOutputs got = run_case(spec, tensors, backend, /*backward=*/true);
  expect_same(got.o, clean.o, "o");
  expect_same(got.lse, clean.lse, "lse");
  expect_same(got.dq, clean.dq, "dq");
  expect_same(got.dk, clean.dk, "dk");
  expect_same(got.dv, clean.dv, "dv");
  expect_same(got.dsoftmax_offset, clean.dsoftmax_offset, "dsoftmax_offset");
}

INSTANTIATE_TEST_SUITE_P(Cases, RowsPastSequences,
                         ::testing::Combine(::testing::Values("padded_bshd", "thd_with_gaps"),
                                            ::testing::Values(BackendKind::kCpuExact,
                                                              BackendKind::kCpu)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::string(to_string(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace dpa::test
