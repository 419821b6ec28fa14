// The LSE merge of one row (DESIGN.md §8), shared by the split-KV merges of cuda_flash and of the
// KV-cache kernels: partials over disjoint key ranges combine in fp32 as
// LSE = log(sum_s exp(LSE_s) + exp(sigma)), o = sum_s o_s exp(LSE_s - LSE); the sink sigma joins
// once, here, as one more partial with o = 0.
#pragma once

#include <cstdint>

#include "cuda/device_common.cuh"

namespace dpa::cuda {

// One warp merges row `row` of partial_lse [splits, split_stride] and partial_o [splits,
// split_stride, head_dim_v] into o_row (lanes stride over the head dim). Returns the merged LSE.
template <typename Element>
__device__ __forceinline__ float merge_row(const float* partial_lse, const float* partial_o,
                                           int64_t split_stride, int64_t row, int num_splits,
                                           float sink, int head_dim_v, int lane, Element* o_row) {
  float max_lse = sink;
  for (int s = 0; s < num_splits; ++s)
    max_lse = max_keeping_nan(max_lse, partial_lse[s * split_stride + row]);
  const float shift = max_lse == -INFINITY ? 0.f : max_lse;
  float total = expf(sink - shift);
  for (int s = 0; s < num_splits; ++s) total += expf(partial_lse[s * split_stride + row] - shift);
  // total = 0: no split saw a key (lse = -inf); a NaN partial keeps the row NaN.
  const float lse = total == 0.f ? -INFINITY : shift + logf(total);
  for (int c = lane; c < head_dim_v; c += 32) {
    float acc = 0.f;
    for (int s = 0; s < num_splits; ++s) {
      const float weight = total == 0.f ? 0.f : expf(partial_lse[s * split_stride + row] - lse);
      acc += weight * partial_o[(s * split_stride + row) * head_dim_v + c];
    }
    o_row[c] = from_float<Element>(acc);
  }
  return lse;
}

}  // namespace dpa::cuda
