// Which elements dropout keeps, read bit for bit from the GPU outputs and compared with the
// Philox mapping of DESIGN.md §5 (issue 4: dropout with softcap must keep exactly the elements
// cpu_exact keeps, forward and backward). Every run makes the logits 0 (q.k = 0; capped or not),
// so P is uniform over a row's n_i visible keys, and v_j = e_j:
// - o_i[j] = P keep_ij / keep_prob: nonzero exactly where row i keeps key j (the forward);
// - with dO_i = e_i: dv_j[i] = Pd_ij, the same bits from the dk/dv kernel's own draw;
// - with dO_i = ones (over the keys) dP_ij = keep_ij / keep_prob and D_i = sum_j Pd_ij, so
//   dU_ij = (keep_ij / keep_prob - D_i) / n_i: with k_j = e_j (q = 0) dq_i[j] = scale dU_ij
//   shows the dq kernel's bits, with q_i = e_i (k = 0) dk_j[i] = scale dU_ij the dk/dv
//   kernel's bits in dk. A wrong bit moves an element by scale / (n_i keep_prob).
// No GQA (dk and dv would sum over a group's heads).
#include <gtest/gtest.h>

#include <cmath>
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
  }
};

// What a run sets to unit vectors (the rest of q and k is 0).
enum class Probe { kOutputs, kDq, kDk };

TEST_P(DropoutMask, KeepsExactlyThePhiloxElements) {
  const MaskCase& c = GetParam();
  CaseSpec spec;
  spec.dtype = DType::kFloat16;
  spec.batch = 2;
  spec.seqlen_q = 45;   // <= head dim: q and dO rows can be unit vectors
  spec.seqlen_kv = 61;  // <= head dim: k and V rows too; not a multiple of 8
  spec.heads_q = spec.heads_kv = 2;
  spec.head_dim_qk = spec.head_dim_v = 64;
  spec.config.mask_type = c.mask;
  spec.config.softcap = 1.0;
  spec.config.dropout = 0.3;
  spec.config.seed = 0x1234567890abcdefull;
  spec.want_dsoftmax_offset = false;
  const int64_t b_count = spec.batch, s_q = spec.seqlen_q, s_kv = spec.seqlen_kv;
  const int64_t heads = spec.heads_q, dim = spec.head_dim_v;
  const double scale = 1.0 / 8.0;  // 1 / sqrt(64), the default
  const double keep_prob = dropout_keep_prob(dropout_threshold(spec.config.dropout));
  const uint32_t threshold = dropout_threshold(spec.config.dropout);
  const int64_t delta = c.mask == MaskType::kCausalBottomRight ? s_kv - s_q : 0;
  auto visible = [&](int64_t i, int64_t j) {
    return c.mask == MaskType::kNoMask || j <= i + delta;
  };
  // bshd [b, s, H, d]
  auto q_index = [&](int64_t b, int64_t i, int64_t h, int64_t x) {
    return ((b * s_q + i) * heads + h) * dim + x;
  };
  auto k_index = [&](int64_t b, int64_t j, int64_t h, int64_t x) {
    return ((b * s_kv + j) * heads + h) * dim + x;
  };
  auto keeps = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    // run_device_case draws with RngState{seed, 7}.
    return dropout_keep(spec.config.seed, 7, b, heads, h, i, j, threshold);
  };

  for (Probe probe : {Probe::kOutputs, Probe::kDq, Probe::kDk}) {
    CaseTensors t = make_case(spec);
    t.q.fill(0.0);
    t.k.fill(0.0);
    t.v.fill(0.0);
    t.d_o.fill(0.0);
    for (int64_t b = 0; b < b_count; ++b)
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = 0; j < s_kv; ++j) {
          t.v.set(k_index(b, j, h, j), 1.0);
          if (probe == Probe::kDq) t.k.set(k_index(b, j, h, j), 1.0);
        }
        for (int64_t i = 0; i < s_q; ++i) {
          if (probe == Probe::kDk) t.q.set(q_index(b, i, h, i), 1.0);
          if (probe == Probe::kOutputs)
            t.d_o.set(q_index(b, i, h, i), 1.0);
          else
            for (int64_t j = 0; j < s_kv; ++j) t.d_o.set(q_index(b, i, h, j), 1.0);
        }
      }
    const CaseOutputs got = run_device_case(spec, t, c.backend, true);
    ASSERT_EQ(got.forward_backend, c.backend);
    ASSERT_EQ(got.backward_backend, c.backend);

    int64_t checked = 0, kept = 0, wrong = 0;
    for (int64_t b = 0; b < b_count; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < s_q; ++i) {
          int64_t n = 0, kept_in_row = 0;
          for (int64_t j = 0; j < s_kv; ++j)
            if (visible(i, j)) {
              ++n;
              kept_in_row += keeps(b, h, i, j);
            }
          const double row_delta = double(kept_in_row) / (double(n) * keep_prob);
          for (int64_t j = 0; j < s_kv; ++j) {
            if (!visible(i, j)) continue;
            const bool keep = keeps(b, h, i, j);
            ++checked;
            kept += keep;
            if (probe == Probe::kOutputs) {
              const bool forward_kept = got.o.get(q_index(b, i, h, j)) != 0.0;
              const bool backward_kept = got.dv.get(k_index(b, j, h, i)) != 0.0;
              wrong += (forward_kept != keep) + (backward_kept != keep);
            } else {
              const double expected =
                  scale * ((keep ? 1.0 / keep_prob : 0.0) - row_delta) / double(n);
              const double value = probe == Probe::kDq ? got.dq.get(q_index(b, i, h, j))
                                                       : got.dk.get(k_index(b, j, h, i));
              // A wrong bit moves the element by scale / (n keep_prob); rounding by far less.
              wrong += std::fabs(value - expected) > 0.25 * scale / (double(n) * keep_prob);
            }
          }
        }
    // The mask matters: about 30% of the elements are dropped.
    EXPECT_GT(checked - kept, checked / 5);
    EXPECT_GT(kept, checked / 2);
    EXPECT_EQ(wrong, 0) << (probe == Probe::kOutputs ? "o and dv"
                            : probe == Probe::kDq    ? "dq"
                                                     : "dk")
                        << ": of " << checked << " visible elements";
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
