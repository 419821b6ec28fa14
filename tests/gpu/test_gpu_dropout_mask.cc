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
  int64_t head_dim = 64;  // 192: the wide one-kernel backward on Hopper
  // At most the head dim (unit vectors). The defaults are not multiples of 8 and lie inside one
  // 64-row slab and one key tile; the larger ones reach the warp-specialised forward's second
  // consumer warpgroup and, at 256, a second block of rows and a second key tile per split.
  int64_t seqlen_q = 45, seqlen_kv = 61;
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
  const CaseSpec spec =
      dropout_probe_spec(DType::kFloat16, c.seqlen_q, c.seqlen_kv, 2, c.head_dim, c.mask);
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
                      MaskCase{"unfused_no_mask", MaskType::kNoMask, BackendKind::kCudaUnfused},
                      MaskCase{"flash_hdim192_no_mask", MaskType::kNoMask, BackendKind::kCudaFlash,
                               192},
                      MaskCase{"flash_hdim192_causal_bottom_right", MaskType::kCausalBottomRight,
                               BackendKind::kCudaFlash, 192},
                      MaskCase{"flash_hdim128_no_mask", MaskType::kNoMask, BackendKind::kCudaFlash,
                               128, 125, 128},
                      MaskCase{"flash_hdim256_causal_bottom_right", MaskType::kCausalBottomRight,
                               BackendKind::kCudaFlash, 256, 203, 250}),
    [](const ::testing::TestParamInfo<MaskCase>& info) { return info.param.name; });

}  // namespace
}  // namespace dpa::test
