// Defined values for rows outside every sequence (bshd padding rows, thd gaps): o = 0 and
// LSE = sigma_h (sink) or -inf, as docs/decisions.md specifies for every backend.
#pragma once

#include <cuda_runtime_api.h>

#include "core/problem.h"

namespace dpa::cuda {

// True when some stored row of a q-like (query_side) or k-like tensor lies outside every
// sequence (bshd padding rows, thd gaps).
bool has_rows_outside_sequences(const AttentionProblem& problem, bool query_side = true);

// Writes o = 0 and the empty-row LSE into every stored row (kernels then overwrite real rows).
void fill_empty_forward_rows(const AttentionProblem& problem, cudaStream_t stream);

// Zeroes `width` elements of every stored (row, head) of a q-like (query_side) or k-like tensor.
void zero_stored_rows(const AttentionProblem& problem, const TensorView& tensor,
                      const RowLayout& layout, bool query_side, int64_t heads, int64_t width,
                      cudaStream_t stream);

}  // namespace dpa::cuda
