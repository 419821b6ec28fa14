// Shared pieces of the tiled CPU backend (forward in tiled_forward.cc, backward in
// tiled_backward.cc): tile sizes, fp32 gathers, the logit transform of DESIGN.md §3 applied to
// a tile of q.k products, dropout multipliers, and three small matrix kernels.
//
// All tiles are contiguous row-major fp32 buffers. The kernels keep the reduction order fixed
// (it depends only on the tile, never on the thread), and their innermost loops run over a
// contiguous output dimension without reassociating sums, so the compiler vectorises them
// without -ffast-math.
#pragma once

#include <cstdint>
#include <vector>

#include "core/attention_math.h"
#include "core/problem.h"

namespace dpa::cpu {

// Query rows per task and key columns per inner step. 64 x 64 fp32 scores (16 KiB) and a
// transposed 64-column K tile stay in L1/L2 for head dims up to 256.
constexpr int64_t kTileQ = 64;
constexpr int64_t kTileKv = 64;

// Rows of q (and o, lse) that sequence b occupies: its own length for thd, the whole padded s
// axis for bshd/sbhd (rows past seqlen_q[b] are padded rows with no visible key).
inline int64_t q_extent(const AttentionProblem& p, int64_t b) {
  return p.format == Format::kTHD ? p.seqlen_q[b] : p.max_seqlen_q;
}
inline int64_t kv_extent(const AttentionProblem& p, int64_t b) {
  return p.format == Format::kTHD ? p.seqlen_kv[b] : p.max_seqlen_kv;
}

// The empty-row LSE of head h: the sink logit, or -inf without a sink.
inline float empty_row_lse(const AttentionProblem& p, int64_t h) { return float(sink_logit(p, h)); }

// Packed thd rows [0, total) that belong to no sequence (gaps left by padded offsets).
std::vector<int64_t> thd_gap_rows(int64_t total, const std::vector<int64_t>& seq_start,
                                  const std::vector<int64_t>& seqlen);

// Writes zeros to the heads [0, heads) of packed thd rows `rows` of a [t, heads, dim] tensor.
void zero_packed_rows(const TensorView& tensor, const RowLayout& layout,
                      const std::vector<int64_t>& rows, int64_t heads, int64_t dim);

// Gathers rows s0 .. s0+count-1 of head h of sequence b into out [count, dim] (fp32).
void gather_rows(const TensorView& tensor, const RowLayout& layout, int64_t b, int64_t s0,
                 int64_t count, int64_t h, int64_t dim, float* out);
// Scatters in [count, dim] to those rows, converting to the tensor's dtype.
void scatter_rows(const TensorView& tensor, const RowLayout& layout, int64_t b, int64_t s0,
                  int64_t count, int64_t h, int64_t dim, const float* in);

// out [cols, rows] = in [rows, cols]^T.
void transpose(const float* in, int64_t rows, int64_t cols, float* out);

// The logit transform with the problem's constants resolved once. With qk-layer-scaling
// (layer_number L > 1) it computes with scale/L and cap/L and multiplies by L, which equals
// the plain formula up to rounding (DESIGN.md §3).
class LogitTransform {
 public:
  explicit LogitTransform(const AttentionProblem& problem);

  bool has_softcap() const { return cap_ > 0.0f; }

  // scores [rows, cols] holds q_i . k_j for rows i0.. and key columns j0.. of (b, h); on return
  // it holds the logits s_ij, -inf where j is outside ranges[r] (row i0 + r's visible keys) or
  // masked by the arbitrary mask. With a softcap, tanh_out [rows, cols] (when non-null)
  // receives t_ij = tanh(u_ij / c) for visible pairs (0 elsewhere).
  void apply(int64_t b, int64_t h, int64_t i0, int64_t rows, const KeyRange* ranges, int64_t j0,
             int64_t cols, float* scores, float* tanh_out) const;

 private:
  const AttentionProblem& p_;
  float scale_;    // scale / L
  float cap_;      // cap / L, 0 when off
  float inv_cap_;  // L / cap
  float layer_;    // L (1 when layer scaling is off)
  bool pre_bias_;
  bool post_bias_;
};

// Dropout multipliers keep_ij / keep_prob for row i of (b, h) and columns j0 .. j0+cols-1.
void dropout_multipliers(const AttentionProblem& p, int64_t b, int64_t h, int64_t i, int64_t j0,
                         int64_t cols, float* out);

// The vector kernels (tiled_kernels.cc). Each output element is updated in a fixed order that
// does not depend on the vector width, so every instruction-set clone gives the same bits.

// c [m, n] = a [m, d] . bt [d, n] (bt is the right-hand factor already transposed).
void matmul_transposed(const float* a, const float* bt, int64_t m, int64_t n, int64_t d, float* c);

// c [m, d] += w [m, n] . x [n, d]. Zero weights (masked or dropped pairs) are skipped.
void accumulate_product(const float* w, const float* x, int64_t m, int64_t n, int64_t d, float* c);

// c [n, d] += w [m, n]^T . x [m, d]. Zero weights are skipped.
void accumulate_transposed_product(const float* w, const float* x, int64_t m, int64_t n, int64_t d,
                                   float* c);

// x[i] = exp(x[i] - shift) for i < n, within 2 ulp of std::exp: 0 from -inf, +inf past fp32's
// range, NaN kept. exp_of_shifted_portable is the 4-wide form every CPU has, for the test that
// both give the same bits.
void exp_of_shifted(float* x, int64_t n, float shift);
void exp_of_shifted_portable(float* x, int64_t n, float shift);

// x[i] = tanh(scale x[i]) for i < n, within 2 ulp of the exact tanh; tanh_of_scaled_portable is
// its 4-wide form.
void tanh_of_scaled(float* x, int64_t n, float scale);
void tanh_of_scaled_portable(float* x, int64_t n, float scale);

// The largest of x[0 .. n): NaN if any is NaN, -inf for n = 0.
float max_keeping_nan(const float* x, int64_t n);

// x[0] + ... + x[n - 1] in one fixed order at every vector width (eight lane sums, then a tree);
// sum_in_lanes_portable is its 4-wide form.
float sum_in_lanes(const float* x, int64_t n);
float sum_in_lanes_portable(const float* x, int64_t n);

// max that keeps a NaN (std::max drops it when it is the second argument).
inline float keep_nan_max(float a, float b) { return (b > a || b != b) ? b : a; }

}  // namespace dpa::cpu
