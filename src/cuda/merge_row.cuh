// The LSE merge of one row (DESIGN.md §8), shared by the split-KV merges of cuda_flash and of the
// KV-cache kernels: partials over disjoint key ranges combine in fp32 as
// LSE = log(sum_s exp(LSE_s) + exp(sigma)), o = sum_s o_s exp(LSE_s - LSE); the sink sigma joins
// once, here, as one more partial with o = 0.
#pragma once

#include <cstdint>

#include "cuda/device_common.cuh"

namespace dpa::cuda {

// A merge block's threads (warps), and the most splits a row may have (both callers' split
// heuristics stop at 128: flash_tiles.h, core/kvcache_splits.h).
constexpr int kMergeWarps = 4;
constexpr int kMergeThreads = 32 * kMergeWarps;
constexpr int kMergeMaxSplits = 128;

// One block of kMergeThreads threads merges row `row` of partial_lse [splits, split_stride] and
// partial_o [splits, split_stride, head_dim_v] into o_row, and returns the merged LSE (every
// thread). Warp 0 reads each split's LSE once and leaves the weights exp(LSE_s - LSE) in shared
// memory; then warp w sums splits w, w + 4, ... of 128 columns (four per lane), all its loads in
// flight at once, and warp 0 adds the four sums. Decode merges up to 128 splits of few rows: a
// row per block spreads them over the SMs, and two rounds of loads (the LSEs, then o) bound the
// latency. head_dim_v is a multiple of 4 (every compiled head dim), so the partial rows are
// 16-byte aligned. Every thread of the block must call it (it synchronises the block).
template <typename Element>
__device__ __forceinline__ float merge_row(const float* partial_lse, const float* partial_o,
                                           int64_t split_stride, int64_t row, int num_splits,
                                           float sink, int head_dim_v, Element* o_row) {
  constexpr int kPerWarp = kMergeMaxSplits / kMergeWarps;
  __shared__ float weights[kMergeMaxSplits];
  __shared__ float4 warp_sums[kMergeWarps - 1][32];
  __shared__ float merged_lse;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 0) {
    constexpr int kHeld = kMergeMaxSplits / 32;
    float held[kHeld];
    float max_lse = sink;
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
      const int s = lane + 32 * i;
      held[i] = s < num_splits ? partial_lse[s * split_stride + row] : -INFINITY;
      max_lse = max_keeping_nan(max_lse, held[i]);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      max_lse = max_keeping_nan(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
    const float shift = max_lse == -INFINITY ? 0.f : max_lse;
    float total = lane == 0 ? expf(sink - shift) : 0.f;
#pragma unroll
    for (int i = 0; i < kHeld; ++i) total += expf(held[i] - shift);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      total += __shfl_xor_sync(0xffffffffu, total, offset);
    // total = 0: no split saw a key (lse = -inf); a NaN partial keeps the row NaN.
    const float lse = total == 0.f ? -INFINITY : shift + logf(total);
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
      const int s = lane + 32 * i;
      if (s < num_splits) weights[s] = total == 0.f ? 0.f : expf(held[i] - lse);
    }
    if (lane == 0) merged_lse = lse;
  }
  __syncthreads();
  const float lse = merged_lse;  // read before the loop's barriers: the next row rewrites it
  for (int c0 = 0; c0 < head_dim_v; c0 += 128) {
    const int c = c0 + 4 * lane;
    const bool mine = c < head_dim_v;
    float4 part[kPerWarp];
#pragma unroll
    for (int i = 0; i < kPerWarp; ++i) {
      const int s = warp + kMergeWarps * i;
      part[i] = mine && s < num_splits ? *reinterpret_cast<const float4*>(
                                             partial_o + (s * split_stride + row) * head_dim_v + c)
                                       : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < kPerWarp; ++i) {
      const int s = warp + kMergeWarps * i;
      const float w = s < num_splits ? weights[s] : 0.f;
      acc.x += w * part[i].x;
      acc.y += w * part[i].y;
      acc.z += w * part[i].z;
      acc.w += w * part[i].w;
    }
    if (warp > 0) warp_sums[warp - 1][lane] = acc;
    __syncthreads();
    if (warp == 0 && mine) {
#pragma unroll
      for (int w = 0; w < kMergeWarps - 1; ++w) {
        acc.x += warp_sums[w][lane].x;
        acc.y += warp_sums[w][lane].y;
        acc.z += warp_sums[w][lane].z;
        acc.w += warp_sums[w][lane].w;
      }
      o_row[c] = from_float<Element>(acc.x);
      o_row[c + 1] = from_float<Element>(acc.y);
      o_row[c + 2] = from_float<Element>(acc.z);
      o_row[c + 3] = from_float<Element>(acc.w);
    }
    __syncthreads();  // warp_sums is read; the weights too, for the block's next row
  }
  return lse;
}

}  // namespace dpa::cuda
