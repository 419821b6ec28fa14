// The LSE merge of one row (DESIGN.md §8), shared by the split-KV merges of cuda_flash and of the
// KV-cache kernels: partials over disjoint key ranges combine in fp32 as
// LSE = log(sum_s exp(LSE_s) + exp(sigma)), o = sum_s o_s exp(LSE_s - LSE); the sink sigma joins
// once, here, as one more partial with o = 0.
#pragma once

#include <cstdint>

#include "cuda/device_common.cuh"

namespace dpa::cuda {

// One warp merges row `row` of partial_lse [splits, split_stride] and partial_o [splits,
// split_stride, head_dim_v] into o_row. Returns the merged LSE (every lane). The lanes share the
// splits for the LSE and the columns for o, four at a time where head_dim_v allows, so that a
// row's loads are in flight together (decode merges up to 128 splits of one row).
template <typename Element>
__device__ __forceinline__ float merge_row(const float* partial_lse, const float* partial_o,
                                           int64_t split_stride, int64_t row, int num_splits,
                                           float sink, int head_dim_v, int lane, Element* o_row) {
  float max_lse = sink;
  for (int s = lane; s < num_splits; s += 32)
    max_lse = max_keeping_nan(max_lse, partial_lse[s * split_stride + row]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    max_lse = max_keeping_nan(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
  const float shift = max_lse == -INFINITY ? 0.f : max_lse;
  float total = lane == 0 ? expf(sink - shift) : 0.f;
  for (int s = lane; s < num_splits; s += 32)
    total += expf(partial_lse[s * split_stride + row] - shift);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    total += __shfl_xor_sync(0xffffffffu, total, offset);
  // total = 0: no split saw a key (lse = -inf); a NaN partial keeps the row NaN.
  const float lse = total == 0.f ? -INFINITY : shift + logf(total);
  // The splits' weights exp(LSE_s - LSE), computed once: lane l holds those of splits l, l + 32,
  // l + 64 and l + 96 and hands them out by shuffle (beyond: computed where needed).
  constexpr int kHeld = 4;
  float held[kHeld];
#pragma unroll
  for (int i = 0; i < kHeld; ++i) {
    const int s = lane + 32 * i;
    held[i] =
        s < num_splits && total != 0.f ? expf(partial_lse[s * split_stride + row] - lse) : 0.f;
  }
  auto weight = [&](int s) {  // every lane calls it with the same s
    if (s >= 32 * kHeld)
      return total == 0.f ? 0.f : expf(partial_lse[s * split_stride + row] - lse);
    const int i = s / 32;
    const float mine = i == 0 ? held[0] : i == 1 ? held[1] : i == 2 ? held[2] : held[3];
    return __shfl_sync(0xffffffffu, mine, s % 32);
  };
  // Column loops run alike on every lane (the shuffles need all 32).
  if (head_dim_v % 4 == 0) {  // partial rows are then 16-byte aligned (their buffer is)
    for (int c0 = 0; c0 < head_dim_v; c0 += 128) {
      const int c = c0 + 4 * lane;
      const bool mine = c < head_dim_v;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      // Batches of sixteen splits: their loads first, so that they are in flight together.
      constexpr int kBatch = 16;
      for (int s0 = 0; s0 < num_splits; s0 += kBatch) {
        float4 part[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const int s = s0 + i;
          part[i] = mine && s < num_splits
                        ? *reinterpret_cast<const float4*>(
                              partial_o + (s * split_stride + row) * head_dim_v + c)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const float w = s0 + i < num_splits ? weight(s0 + i) : 0.f;
          acc.x += w * part[i].x;
          acc.y += w * part[i].y;
          acc.z += w * part[i].z;
          acc.w += w * part[i].w;
        }
      }
      if (!mine) continue;
      o_row[c] = from_float<Element>(acc.x);
      o_row[c + 1] = from_float<Element>(acc.y);
      o_row[c + 2] = from_float<Element>(acc.z);
      o_row[c + 3] = from_float<Element>(acc.w);
    }
    return lse;
  }
  for (int c0 = 0; c0 < head_dim_v; c0 += 32) {
    const int c = c0 + lane;
    float acc = 0.f;
    for (int s = 0; s < num_splits; ++s) {
      const float w = weight(s);
      if (c < head_dim_v) acc += w * partial_o[(s * split_stride + row) * head_dim_v + c];
    }
    if (c < head_dim_v) o_row[c] = from_float<Element>(acc);
  }
  return lse;
}

}  // namespace dpa::cuda
