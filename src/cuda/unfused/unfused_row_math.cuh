// Device-side helpers shared by the unfused row kernels: dtype conversion, the logit of one
// (i, j) pair exactly as core/attention_math.h defines it (in fp32), and deterministic block
// reductions (fixed shuffle and shared-memory order, no atomics).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/philox.h"
#include "cuda/device_common.cuh"
#include "cuda/unfused/unfused_kernels.h"

namespace dpa::cuda::unfused {

// Row kernels use one block of this many threads per score row: rows are long (skv) and
// memory-bound, four warps keep enough loads in flight without idling on short rows.
constexpr int kRowThreads = 128;
constexpr int kRowWarps = kRowThreads / 32;

// A bias element of any floating dtype (the bias need not have q's dtype).
__device__ __forceinline__ float load_any_float(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kFloat16:
      return __half2float(static_cast<const __half*>(base)[offset]);
    case DType::kBFloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[offset]);
    case DType::kFloat64:
      return float(static_cast<const double*>(base)[offset]);
    default:
      return static_cast<const float*>(base)[offset];
  }
}

// Everything about score row (b, h, i) that does not depend on the key j.
struct RowContext {
  int64_t b = 0, h = 0, i = 0;
  int64_t seqlen_q = 0, seqlen_kv = 0;
  int64_t key_begin = 0, key_end = 0;  // window and lengths: keys [begin, end) may be visible
  int64_t diagonal = 0;                // i + delta (delta = skv - sq bottom-right, else 0)
  float alibi_slope = 0.f;
  float sink = -INFINITY;    // sigma_h; -inf without a sink
  int64_t bias_row = 0;      // offset of (b, h, i, 0) in the bias
  int64_t mask_row = 0;      // offset of (b, h, i, 0) in the mask
  int64_t dropout_row = 0;   // the row dropout draws at (i, or a CP tile's global row)
  int64_t dropout_col0 = 0;  // added to j for the key dropout draws at
};

// `row` indexes the [b, H, sq_max] rows of the score grid.
__device__ __forceinline__ RowContext make_row_context(const ScoreGrid& grid,
                                                       const LogitTransform& lt, int64_t row) {
  RowContext r;
  r.i = row % grid.max_seqlen_q;
  r.h = (row / grid.max_seqlen_q) % grid.heads;
  r.b = row / (grid.max_seqlen_q * grid.heads);
  r.seqlen_q = grid.seqlen_q[r.b];
  r.seqlen_kv = grid.seqlen_kv[r.b];
  // visible_keys() of core/attention_math.h, line for line.
  r.diagonal = r.i + lt.diagonal[r.b];
  if (r.i < r.seqlen_q && r.seqlen_kv > 0) {
    int64_t begin = lt.window_left < 0 ? 0 : max(int64_t(0), r.diagonal - lt.window_left);
    int64_t end =
        lt.window_right < 0 ? r.seqlen_kv : min(r.seqlen_kv, r.diagonal + lt.window_right + 1);
    begin = min(begin, r.seqlen_kv);
    if (end < begin) end = begin;
    r.key_begin = begin;
    r.key_end = end;
  }
  if (lt.alibi_slopes) r.alibi_slope = lt.alibi_slopes[r.b * lt.alibi_stride_batch + r.h];
  r.sink = lt.exclude_sink ? -INFINITY : sink_logit(lt.softmax_type, lt.softmax_offset, r.h);
  // Unsharded bias / mask (CP tiles): element (b, h, i, j) sits at the global head, row and key.
  const int64_t aux_h = lt.aux_global ? r.h + lt.head_offset : r.h;
  const int64_t aux_i = lt.aux_global ? r.i + lt.q_position[r.b] : r.i;
  const int64_t aux_j0 = lt.aux_global ? lt.kv_position[r.b] : 0;
  r.bias_row = r.b * lt.bias_strides.batch + aux_h * lt.bias_strides.head +
               aux_i * lt.bias_strides.q + aux_j0 * lt.bias_strides.kv;
  r.mask_row = r.b * lt.mask_strides.batch + aux_h * lt.mask_strides.head +
               aux_i * lt.mask_strides.q + aux_j0 * lt.mask_strides.kv;
  r.dropout_row = r.i + lt.q_position[r.b];
  r.dropout_col0 = lt.kv_position[r.b];
  return r;
}

// The logit s of (i, j) from the raw qk: false when the pair is masked. `t` receives
// tanh(u / c) with a softcap (for dU = dS * (1 - t^2)), else 0. DESIGN.md §3 steps 1-4.
__device__ __forceinline__ bool element_logit(const LogitTransform& lt, const RowContext& r,
                                              int64_t j, float qk, float& s, float& t) {
  if (j < r.key_begin || j >= r.key_end) return false;
  if (lt.attn_mask && lt.attn_mask[r.mask_row + j * lt.mask_strides.kv]) return false;
  float u = qk;
  if (lt.bias_type == int(BiasType::kPreScale))
    u += load_any_float(lt.bias, lt.bias_dtype, r.bias_row + j * lt.bias_strides.kv);
  u *= lt.scale;
  s = u;
  t = 0.f;
  if (lt.softcap > 0.f) {
    t = tanhf(u / lt.softcap);
    s = lt.softcap * t;
  }
  if (lt.bias_type == int(BiasType::kPostScale))
    s += load_any_float(lt.bias, lt.bias_dtype, r.bias_row + j * lt.bias_strides.kv);
  if (lt.alibi_slopes) s -= r.alibi_slope * fabsf(float(r.diagonal - j));
  return true;
}

// keep_ij / keep_prob of DESIGN.md §5 (1 without dropout).
__device__ __forceinline__ float dropout_multiplier(const LogitTransform& lt, const RowContext& r,
                                                    int64_t j) {
  if (lt.dropout_threshold == 0) return 1.f;
  // dropout_keep() of core/philox.h, with the 16-bit element picked by an unrolled compare:
  // dropout_u16(block, j & 7) with a run-time index would put the block in local memory.
  const int64_t col = j + r.dropout_col0;
  const Philox4 block = dropout_block(lt.seed, lt.offset, r.b, lt.heads_total, r.h + lt.head_offset,
                                      r.dropout_row, col);
  const int k = int(col & 7);
  uint32_t u16 = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e)
    if (e == k) u16 = dropout_u16(block, e);
  return u16 >= lt.dropout_threshold ? lt.dropout_scale : 0.f;
}

// Running softmax statistics: max m and sum z of exp(s - m). Merging handles m = -inf (no
// term yet) without forming exp(-inf - -inf) = NaN. A NaN logit makes m and z NaN for good
// (docs/decisions.md): otherwise a row whose logits are all NaN would read as empty.
struct MaxSum {
  float m = -INFINITY;
  float z = 0.f;
  __device__ __forceinline__ void add(float s) {
    if (s == -INFINITY) return;  // a -inf logit (e.g. from a -inf bias) adds exp(-inf) = 0
    if (s != s) {
      m = z = s;
      return;
    }
    if (s > m) {
      z = z * expf(m - s) + 1.f;
      m = s;
    } else {
      z += expf(s - m);
    }
  }
  __device__ __forceinline__ void merge(float other_m, float other_z) {
    const float top = max_keeping_nan(m, other_m);
    if (top == -INFINITY) return;
    z = z * expf(m - top) + other_z * expf(other_m - top);
    m = top;
  }
};

// Combines every thread's MaxSum; all threads get the result. `shared` holds 2 * kRowWarps
// floats. The combination order is fixed, so results are bit-identical run to run.
__device__ __forceinline__ MaxSum block_max_sum(MaxSum value, float* shared) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_m = __shfl_xor_sync(0xffffffffu, value.m, offset);
    const float other_z = __shfl_xor_sync(0xffffffffu, value.z, offset);
    value.merge(other_m, other_z);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    shared[warp] = value.m;
    shared[kRowWarps + warp] = value.z;
  }
  __syncthreads();
  MaxSum total;
  for (int w = 0; w < kRowWarps; ++w) total.merge(shared[w], shared[kRowWarps + w]);
  __syncthreads();  // `shared` may be reused right after
  return total;
}

// Sum over the block; all threads get the result (fixed order). `shared`: kRowWarps floats.
__device__ __forceinline__ float block_sum(float value, float* shared) {
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kRowWarps; ++w) total += shared[w];
  __syncthreads();
  return total;
}

// Grid for one block per row: capped, the kernels loop over the remaining rows.
inline unsigned row_grid(int64_t rows) {
  constexpr int64_t kMaxBlocks = int64_t(1) << 20;
  return unsigned(rows < kMaxBlocks ? rows : kMaxBlocks);
}

}  // namespace dpa::cuda::unfused
