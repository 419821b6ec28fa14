// Helpers that touch every stored row of a tensor, padding and thd gaps included, so that
// backends can give rows outside every sequence a defined value (o = 0, gradients = 0).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/attention_math.h"
#include "core/problem.h"

namespace dpa {

// Calls fn(offset_of_row_head) for every stored (row, head) of a [.., s, heads, d] tensor.
template <typename Fn>
void for_each_stored_row(const AttentionProblem& p, const RowLayout& layout, bool query_side,
                         int64_t heads, Fn&& fn) {
  if (p.format == Format::kTHD) {
    const int64_t rows = query_side ? p.total_q : p.total_kv;
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t h = 0; h < heads; ++h) fn(t * layout.stride_seq + h * layout.stride_head);
    return;
  }
  const int64_t rows = query_side ? p.max_seqlen_q : p.max_seqlen_kv;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < rows; ++s)
      for (int64_t h = 0; h < heads; ++h) fn(layout.offset(b, s, h));
}

// Sets `width` elements of every stored row of `tensor` to zero.
inline void zero_rows(const AttentionProblem& p, const TensorView& tensor, const RowLayout& layout,
                      bool query_side, int64_t heads, int64_t width) {
  for_each_stored_row(p, layout, query_side, heads, [&](int64_t offset) {
    for (int64_t c = 0; c < width; ++c) store(tensor, offset + c, 0.0);
  });
}

// LSE of a row with no visible key: the sink logit, or -inf without a sink.
inline void fill_lse_empty(const AttentionProblem& p) {
  const int64_t rows = p.format == Format::kTHD ? p.total_q : p.max_seqlen_q;
  const int64_t batches = p.format == Format::kTHD ? 1 : p.batch;
  float* lse = static_cast<float*>(p.lse.data);
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const float empty = float(sink_logit(p, h));
      float* row = lse + (b * p.heads_q + h) * rows;
      for (int64_t i = 0; i < rows; ++i) row[i] = empty;
    }
}

}  // namespace dpa
