// Which elements dropout keeps, read bit for bit from the GPU outputs and compared with the
// Philox mapping of DESIGN.md §5 (issue 4: dropout with softcap must keep exactly the elements
// cpu_exact keeps, forward and backward), through the probes of support/dropout_probe.h.
#include <gtest/gtest.h>

#include <string>

#include "gpu/device_case.h"
#include "support/attention_case.h"
#include "support/dropout_probe.h"

namespace dpa::test {
namespace {

struct MaskCase {
  std::string name;
  MaskType mask;
  BackendKind backend;
};

class DropoutMask : public ::testing::TestWithParam<MaskCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
  }
};

TEST_P(DropoutMask, KeepsExactlyThePhiloxElements) {
  const MaskCase& c = GetParam();
  // seqlen_q 45 and seqlen_kv 61: at most the head dim (unit vectors), not multiples of 8.
  const CaseSpec spec = dropout_probe_spec(DType::kFloat16, 45, 61, 2, 64, c.mask);
  for (DropoutProbe probe : kDropoutProbes) {
    const CaseOutputs got =
        run_device_case(spec, dropout_probe_tensors(spec, probe), c.backend, true);
    ASSERT_EQ(got.forward_backend, c.backend);
    ASSERT_EQ(got.backward_backend, c.backend);
    // run_device_case draws with RngState{seed, 7}.
    EXPECT_EQ(dropout_probe_failure(probe, count_dropout_probe(spec, probe, got, 7)), "");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Backends, DropoutMask,
    ::testing::Values(MaskCase{"flash_no_mask", MaskType::kNoMask, BackendKind::kCudaFlash},
                      MaskCase{"flash_causal_bottom_right", MaskType::kCausalBottomRight,
                               BackendKind::kCudaFlash},
                      MaskCase{"unfused_no_mask", MaskType::kNoMask, BackendKind::kCudaUnfused}),
    [](const ::testing::TestParamInfo<MaskCase>& info) { return info.param.name; });

}  // namespace
}  // namespace dpa::test
