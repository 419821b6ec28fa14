#include "cpu/tiled_common.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dpa::cpu {

namespace {
constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();
}  // namespace

std::vector<int64_t> thd_gap_rows(int64_t total, const std::vector<int64_t>& seq_start,
                                  const std::vector<int64_t>& seqlen) {
  std::vector<char> covered(size_t(std::max<int64_t>(total, 0)), 0);
  for (size_t b = 0; b < seqlen.size(); ++b) {
    int64_t begin = std::clamp<int64_t>(seq_start[b], 0, total);
    int64_t end = std::clamp<int64_t>(seq_start[b] + seqlen[b], begin, total);
    std::fill(covered.begin() + begin, covered.begin() + end, 1);
  }
  std::vector<int64_t> gaps;
  for (int64_t row = 0; row < total; ++row) {
    if (!covered[size_t(row)]) gaps.push_back(row);
  }
  return gaps;
}

void zero_packed_rows(const TensorView& tensor, const RowLayout& layout,
                      const std::vector<int64_t>& rows, int64_t heads, int64_t dim) {
  if (rows.empty() || dim == 0) return;
  std::vector<float> zeros(size_t(dim), 0.0f);
  for (int64_t row : rows) {
    for (int64_t h = 0; h < heads; ++h) {
      store_row_f32(tensor.data, tensor.dtype, row * layout.stride_seq + h * layout.stride_head,
                    dim, zeros.data());
    }
  }
}

void gather_rows(const TensorView& tensor, const RowLayout& layout, int64_t b, int64_t s0,
                 int64_t count, int64_t h, int64_t dim, float* out) {
  for (int64_t r = 0; r < count; ++r) {
    load_row_f32(tensor.data, tensor.dtype, layout.offset(b, s0 + r, h), dim, out + r * dim);
  }
}

void scatter_rows(const TensorView& tensor, const RowLayout& layout, int64_t b, int64_t s0,
                  int64_t count, int64_t h, int64_t dim, const float* in) {
  for (int64_t r = 0; r < count; ++r) {
    store_row_f32(tensor.data, tensor.dtype, layout.offset(b, s0 + r, h), dim, in + r * dim);
  }
}

void transpose(const float* in, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
}

LogitTransform::LogitTransform(const AttentionProblem& problem) : p_(problem) {
  const double layer = problem.layer_number > 1 ? double(problem.layer_number) : 1.0;
  scale_ = float(problem.scale / layer);
  cap_ = float(problem.softcap / layer);
  inv_cap_ = problem.softcap > 0.0 ? float(layer / problem.softcap) : 0.0f;
  layer_ = float(layer);
  pre_bias_ = problem.bias_type == BiasType::kPreScale;
  post_bias_ = problem.bias_type == BiasType::kPostScale;
}

// Reads bias row (b, h, i), columns j0 .. j0+cols-1, as fp32.
static void load_bias_segment(const AttentionProblem& p, int64_t b, int64_t h, int64_t i,
                              int64_t j0, int64_t cols, float* out) {
  const int64_t start = p.aux_offset(p.bias_layout, b, h, i, j0);
  if (p.bias_layout.stride_kv == 1) {
    load_row_f32(p.bias.data, p.bias.dtype, start, cols, out);
    return;
  }
  for (int64_t c = 0; c < cols; ++c) {
    out[c] = float(load(p.bias, start + c * p.bias_layout.stride_kv));
  }
}

void LogitTransform::apply(int64_t b, int64_t h, int64_t i0, int64_t rows, const KeyRange* ranges,
                           int64_t j0, int64_t cols, float* scores, float* tanh_out) const {
  std::vector<float> bias_row((pre_bias_ || post_bias_) ? size_t(cols) : 0);
  const float slope = p_.has_alibi ? float(alibi_slope(p_, b, h)) : 0.0f;
  const int64_t delta = p_.diagonal_offset(b);
  const bool softcap = cap_ > 0.0f;

  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    float* s = scores + r * cols;
    float* t = tanh_out ? tanh_out + r * cols : nullptr;
    const int64_t lo = std::clamp<int64_t>(ranges[r].begin - j0, 0, cols);
    const int64_t hi = std::clamp<int64_t>(ranges[r].end - j0, lo, cols);
    for (int64_t c = 0; c < lo; ++c) s[c] = kNegativeInfinity;
    for (int64_t c = hi; c < cols; ++c) s[c] = kNegativeInfinity;
    if (t) {
      for (int64_t c = 0; c < cols; ++c) t[c] = 0.0f;
    }
    if (lo == hi) continue;

    // u = scale * (q.k + Bpre)
    if (pre_bias_) {
      load_bias_segment(p_, b, h, i, j0 + lo, hi - lo, bias_row.data());
      for (int64_t c = lo; c < hi; ++c) s[c] += bias_row[size_t(c - lo)];
    }
    for (int64_t c = lo; c < hi; ++c) s[c] *= scale_;
    // s = c * tanh(u / c)
    if (softcap) {
      tanh_of_scaled(s + lo, hi - lo, inv_cap_);
      if (t) std::copy(s + lo, s + hi, t + lo);
      for (int64_t c = lo; c < hi; ++c) s[c] *= cap_;
    }
    if (layer_ != 1.0f) {
      for (int64_t c = lo; c < hi; ++c) s[c] *= layer_;
    }
    // Post-cap terms: bias, then ALiBi -slope * |i + delta - j|.
    if (post_bias_) {
      load_bias_segment(p_, b, h, i, j0 + lo, hi - lo, bias_row.data());
      for (int64_t c = lo; c < hi; ++c) s[c] += bias_row[size_t(c - lo)];
    }
    if (p_.has_alibi) {
      const int64_t center = i + delta;
      for (int64_t c = lo; c < hi; ++c) {
        s[c] -= slope * float(std::llabs(center - (j0 + c)));
      }
    }
    if (p_.has_attn_mask) {
      for (int64_t c = lo; c < hi; ++c) {
        if (masked_by_tensor(p_, b, h, i, j0 + c)) {
          s[c] = kNegativeInfinity;
          if (t) t[c] = 0.0f;
        }
      }
    }
  }
}

void dropout_multipliers(const AttentionProblem& p, int64_t b, int64_t h, int64_t i, int64_t j0,
                         int64_t cols, float* out) {
  if (p.dropout_threshold == 0) {
    for (int64_t c = 0; c < cols; ++c) out[c] = 1.0f;
    return;
  }
  const float kept = float(1.0 / p.keep_prob);
  // One Philox call yields the draws of 8 consecutive columns (DESIGN.md §5), at the global
  // coordinates of a CP tile.
  const int64_t heads = p.global_heads(), head = h + p.cp.head_offset, row = p.global_row(b, i);
  int64_t c = 0;
  while (c < cols) {
    const int64_t j = p.global_col(b, j0 + c);
    const Philox4 block = dropout_block(p.rng.seed, p.rng.offset, b, heads, head, row, j);
    for (int64_t k = j & 7; k < 8 && c < cols; ++k, ++c) {
      out[c] = dropout_u16(block, int(k)) >= p.dropout_threshold ? kept : 0.0f;
    }
  }
}

}  // namespace dpa::cpu
