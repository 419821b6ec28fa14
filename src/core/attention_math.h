// The per-element semantics of DESIGN.md sections 3-5, shared by the host backends (and the
// benches' FLOP counts):
// visibility, the logit transform (scale, pre/post bias, softcap, ALiBi), sinks and dropout.
// Backends call these so that a rule is written down once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/element_access.h"
#include "core/philox.h"
#include "core/problem.h"

namespace dpa {

// Keys [begin, end) that the window and the sequence lengths leave visible to row i of
// sequence b. Arbitrary masks are applied per element on top (see `masked_by_tensor`).
struct KeyRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool empty() const { return end <= begin; }
};

// Row i of a sequence of seqlen_q queries and seqlen_kv keys whose query 0 sits on key
// `diagonal`; windows of -1 are unbounded.
inline KeyRange visible_keys(int64_t i, int64_t seqlen_q, int64_t seqlen_kv, int64_t diagonal,
                             int64_t window_left, int64_t window_right) {
  const int64_t sq = seqlen_q, skv = seqlen_kv;
  if (i >= sq || skv == 0) return {0, 0};
  const int64_t center = i + diagonal;
  // Compared before adding, so that windows up to INT64_MAX cannot overflow.
  int64_t begin = window_left < 0 || window_left >= center ? 0 : center - window_left;
  int64_t end = window_right < 0 || window_right >= skv - center - 1
                    ? skv
                    : std::max<int64_t>(0, center + window_right + 1);
  begin = std::min(begin, skv);  // a window left of every key must stay empty, not [skv, end)
  if (end < begin) end = begin;
  return {begin, end};
}

inline KeyRange visible_keys(const AttentionProblem& p, int64_t b, int64_t i) {
  return visible_keys(i, p.seqlen_q[b], p.seqlen_kv[b], p.diagonal_offset(b), p.window_left,
                      p.window_right);
}

// Visible (query, key) pairs of one head of one sequence (the window and the diagonal, no
// arbitrary mask): what the benches' TFLOP/s count (DESIGN.md §10).
inline int64_t visible_pairs(int64_t seqlen_q, int64_t seqlen_kv, int64_t diagonal,
                             int64_t window_left, int64_t window_right) {
  int64_t pairs = 0;
  for (int64_t i = 0; i < seqlen_q; ++i) {
    const KeyRange range =
        visible_keys(i, seqlen_q, seqlen_kv, diagonal, window_left, window_right);
    pairs += range.end - range.begin;
  }
  return pairs;
}

inline bool masked_by_tensor(const AttentionProblem& p, int64_t b, int64_t h, int64_t i,
                             int64_t j) {
  if (!p.has_attn_mask) return false;
  return load(p.attn_mask, p.aux_offset(p.mask_layout, b, h, i, j)) != 0.0;
}

inline bool visible(const AttentionProblem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  KeyRange range = visible_keys(p, b, i);
  return j >= range.begin && j < range.end && !masked_by_tensor(p, b, h, i, j);
}

// Bias terms of element (b, h, i, j). Pre-scale bias is added to q.k before the scale.
inline double pre_scale_bias(const AttentionProblem& p, int64_t b, int64_t h, int64_t i,
                             int64_t j) {
  if (p.bias_type != BiasType::kPreScale) return 0.0;
  return load(p.bias, p.aux_offset(p.bias_layout, b, h, i, j));
}

inline double alibi_slope(const AttentionProblem& p, int64_t b, int64_t h) {
  return load(p.alibi_slopes, b * p.alibi_stride_batch + h);
}

// Post-cap additive terms: the post-scale bias and ALiBi (-slope * |i + delta - j|).
inline double post_cap_bias(const AttentionProblem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  double total = 0.0;
  if (p.bias_type == BiasType::kPostScale)
    total += load(p.bias, p.aux_offset(p.bias_layout, b, h, i, j));
  if (p.has_alibi) {
    double distance = std::fabs(double(i + p.diagonal_offset(b) - j));
    total -= alibi_slope(p, b, h) * distance;
  }
  return total;
}

// sigma_h of DESIGN.md §3.5: -inf for vanilla (no sink), 0 for off-by-one, alpha_h for learnable.
// A CP tile's forward partial leaves the sink out (it joins once, after the merge).
inline double sink_logit(const AttentionProblem& p, int64_t h) {
  if (p.cp.exclude_sink) return -std::numeric_limits<double>::infinity();
  switch (p.softmax_type) {
    case SoftmaxType::kVanilla:
      return -std::numeric_limits<double>::infinity();
    case SoftmaxType::kOffByOne:
      return 0.0;
    case SoftmaxType::kLearnable:
      return load(p.softmax_offset, h);
  }
  return -std::numeric_limits<double>::infinity();
}

// Dropout multiplier keep_ij / keep_prob for element (b, h, i, j); i, j are positions within
// sequence b (DESIGN.md §5). A CP tile draws at its global head, row and column.
inline double dropout_scale(const AttentionProblem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (p.dropout_threshold == 0) return 1.0;
  bool keep = dropout_keep(p.rng.seed, p.rng.offset, b, p.global_heads(), h + p.cp.head_offset,
                           p.global_row(b, i), p.global_col(b, j), p.dropout_threshold);
  return keep ? 1.0 / p.keep_prob : 0.0;
}

}  // namespace dpa
