// Which elements dropout keeps, read bit for bit from the GPU outputs and compared with the
// Philox mapping of DESIGN.md §5 (issue 4: dropout with softcap must keep exactly the elements
// cpu_exact keeps, forward and backward). With q = k = 0 every visible logit is 0 (capped or
// not), so P is uniform over a row's visible keys; with v_j = e_j, o_i[j] = P keep_ij / keep_prob
// is nonzero exactly where key j is kept for row i; with dO_i = e_i, dv_j[i] = Pd_ij is nonzero
// exactly where row i keeps key j, which is the dk/dv kernel's own draw. No GQA (dv would sum
// over a group's heads).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/philox.h"
#include "gpu/device_case.h"
#include "support/attention_case.h"

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
    setenv("DPA_FLASH_BACKWARD", "1", 1);  // the fused backward's opt-in
  }
  void TearDown() override { unsetenv("DPA_FLASH_BACKWARD"); }
};

TEST_P(DropoutMask, KeepsExactlyThePhiloxElements) {
  const MaskCase& c = GetParam();
  CaseSpec spec;
  spec.dtype = DType::kFloat16;
  spec.batch = 2;
  spec.seqlen_q = 45;   // <= dv: dO rows are unit vectors
  spec.seqlen_kv = 61;  // <= dv: V rows are unit vectors; not a multiple of 8
  spec.heads_q = spec.heads_kv = 2;
  spec.head_dim_qk = spec.head_dim_v = 64;
  spec.config.mask_type = c.mask;
  spec.config.softcap = 1.0;
  spec.config.dropout = 0.3;
  spec.config.seed = 0x1234567890abcdefull;
  spec.want_dsoftmax_offset = false;
  CaseTensors t = make_case(spec);
  t.q.fill(0.0);
  t.k.fill(0.0);
  t.v.fill(0.0);
  t.d_o.fill(0.0);
  const int64_t b_count = spec.batch, s_q = spec.seqlen_q, s_kv = spec.seqlen_kv;
  const int64_t heads = spec.heads_q, dim = spec.head_dim_v;
  // [b, s, H, d] (bshd): v[b, j, h, j] = 1, dO[b, i, h, i] = 1.
  for (int64_t b = 0; b < b_count; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < s_kv; ++j) t.v.set(((b * s_kv + j) * heads + h) * dim + j, 1.0);
      for (int64_t i = 0; i < s_q; ++i) t.d_o.set(((b * s_q + i) * heads + h) * dim + i, 1.0);
    }

  const CaseOutputs got = run_device_case(spec, t, c.backend, true);
  ASSERT_EQ(got.forward_backend, c.backend);
  ASSERT_EQ(got.backward_backend, c.backend);

  const uint32_t threshold = dropout_threshold(spec.config.dropout);
  const int64_t delta = c.mask == MaskType::kCausalBottomRight ? s_kv - s_q : 0;
  int64_t checked = 0, kept = 0, wrong_forward = 0, wrong_backward = 0;
  for (int64_t b = 0; b < b_count; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < s_q; ++i)
        for (int64_t j = 0; j < s_kv; ++j) {
          const bool visible = c.mask == MaskType::kNoMask || j <= i + delta;
          if (!visible) continue;
          // run_device_case draws with RngState{seed, 7}.
          const bool keep = dropout_keep(spec.config.seed, 7, b, heads, h, i, j, threshold);
          const bool forward_kept = got.o.get(((b * s_q + i) * heads + h) * dim + j) != 0.0;
          const bool backward_kept = got.dv.get(((b * s_kv + j) * heads + h) * dim + i) != 0.0;
          wrong_forward += forward_kept != keep;
          wrong_backward += backward_kept != keep;
          kept += keep;
          ++checked;
        }
  // The mask matters: about 30% of the elements are dropped.
  EXPECT_GT(checked - kept, checked / 5);
  EXPECT_GT(kept, checked / 2);
  EXPECT_EQ(wrong_forward, 0) << "of " << checked << " visible elements (o)";
  EXPECT_EQ(wrong_backward, 0) << "of " << checked << " visible elements (dv)";
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
