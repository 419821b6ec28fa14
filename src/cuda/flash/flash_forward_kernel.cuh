// The flash forward kernel family: tiled online softmax on tensor cores (mma.sync m16n8k16,
// ldmatrix, cp.async), with softcap, sinks, masks/windows, varlen, GQA, ALiBi and dropout as
// runtime switches. Templated on the element type and the head dims only (STYLE.md).
//
// A block owns kBlockM query rows of one (batch, head); each warp owns kSlabs slabs of 16
// rows. Per KV tile of kBlockN keys: S = Q K^T (fp32), the logit transform and mask, an
// online-softmax update of the running max m and sum l, then O += P V. K and V use one
// shared-memory buffer each, loaded alternately with cp.async (FlashAttention-2's schedule):
// V(n) streams in during S(n) = Q K(n)^T and K(n+1) during O += P V(n).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/philox.h"
#include "cuda/device_common.cuh"
#include "cuda/flash/flash_params.h"
#include "cuda/flash/flash_traits.h"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/mma.cuh"

namespace dpa::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// exp2 on the special-function unit (MUFU.EX2, ~2 ulp; flushes denormals, which softmax
// weights below 2^-126 of the row max never need). exp2f() adds range handling around it.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Accurate tanh from one ex2 and one reciprocal: tanh(x) = 1 - 2 / (exp(2x) + 1). Saturates
// to +-1 without NaN (exp overflow gives inf and 2/inf = 0). tanh.approx.f32 would save one
// MUFU op but its ~5e-4 relative error moves capped logits by up to cap * 5e-4.
__device__ __forceinline__ float accurate_tanh(float x) {
  const float e = fast_exp2(x * (2.f * kLog2e));
  return 1.f - __fdividef(2.f, e + 1.f);
}

// Key range [begin, end) visible to query row i of a sequence (DESIGN.md §3).
struct VisibleRange {
  int begin, end;
};

__device__ __forceinline__ VisibleRange visible_range(const FlashForwardParams& p, int i,
                                                      int seqlen_q, int seqlen_kv) {
  if (i >= seqlen_q) return {0, 0};
  const int center = i + (p.bottom_right ? seqlen_kv - seqlen_q : 0);
  int begin = p.window_left < 0 ? 0 : max(0, center - p.window_left);
  int end = p.window_right < 0 ? seqlen_kv : min(seqlen_kv, center + p.window_right + 1);
  return {begin, max(begin, end)};
}

// Copies a rows x kDim tile (rows beyond `valid_rows` read as zeros) into padded shared memory.
template <typename Traits, int kRows, int kDim, int kStride>
__device__ __forceinline__ void load_tile_async(typename Traits::Element* shared_tile,
                                                const typename Traits::Element* global_tile,
                                                int64_t row_stride, int valid_rows) {
  constexpr int kChunksPerRow = kDim / 8;  // 16-byte chunks of 8 elements
  constexpr int kChunks = kRows * kChunksPerRow;
  for (int chunk = threadIdx.x; chunk < kChunks; chunk += Traits::kThreads) {
    const int row = chunk / kChunksPerRow;
    const int column = (chunk % kChunksPerRow) * 8;
    const bool valid = row < valid_rows;
    const typename Traits::Element* source =
        valid ? global_tile + row * row_stride + column : global_tile;
    ptx::cp_async_16(ptx::shared_address(shared_tile + row * kStride + column), source, valid);
  }
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_forward_kernel(const __grid_constant__ FlashForwardParams p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  constexpr int kSlabs = Traits::kSlabs;
  constexpr int kNTiles = kBlockN / 8;  // n8 tiles of S per slab
  constexpr int kVTiles = kDimV / 8;    // n8 tiles of O per slab
  constexpr int kQStride = Traits::kQStride, kKStride = Traits::kKStride;
  constexpr int kVStride = Traits::kVStride;

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Element* q_shared = reinterpret_cast<Element*>(shared_bytes);  // [kBlockM, kQStride]
  Element* k_shared = q_shared + kBlockM * kQStride;             // [kBlockN, kKStride]
  Element* v_shared = k_shared + kBlockN * kKStride;             // [kBlockN, kVStride]

  const int m_block = blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z / p.num_splits;
  const int split = blockIdx.z % p.num_splits;
  const int kv_head = head / p.group_size;
  const int seqlen_q = p.seqlen_q[batch];
  const int seqlen_kv = p.seqlen_kv[batch];
  const int m0 = m_block * kBlockM;
  if (m0 >= seqlen_q) return;
  const int rows_here = min(kBlockM, seqlen_q - m0);

  // KV tiles this block visits: the union of its rows' visible ranges, cut to its split.
  const VisibleRange first_row = visible_range(p, m0, seqlen_q, seqlen_kv);
  const VisibleRange last_row = visible_range(p, m0 + rows_here - 1, seqlen_q, seqlen_kv);
  int n_block_begin = first_row.begin / kBlockN;
  int n_block_end = (last_row.end + kBlockN - 1) / kBlockN;
  if (last_row.end <= first_row.begin) n_block_end = n_block_begin;
  if (p.num_splits > 1) {
    const int split_begin = split * p.blocks_per_split;
    n_block_begin = max(n_block_begin, split_begin);
    n_block_end = min(n_block_end, split_begin + p.blocks_per_split);
  }

  const int64_t q_row0 = (p.start_q ? p.start_q[batch] : 0) + m0;
  const int64_t kv_row0 = p.start_kv ? p.start_kv[batch] : 0;
  const Element* q_global = static_cast<const Element*>(p.q) + batch * p.q_batch_stride +
                            q_row0 * p.q_row_stride + head * p.q_head_stride;
  const Element* k_global = static_cast<const Element*>(p.k) + batch * p.k_batch_stride +
                            kv_row0 * p.k_row_stride + kv_head * p.k_head_stride;
  const Element* v_global = static_cast<const Element*>(p.v) + batch * p.v_batch_stride +
                            kv_row0 * p.v_row_stride + kv_head * p.v_head_stride;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int warp_row0 = warp * 16 * kSlabs;  // first row of this warp within the block

  // Running statistics for the two rows (quad_row, quad_row + 8) of each slab, in log2 units.
  // The sink starts the running max and (once per row: quad lane 0) the running sum.
  const bool split_partial = p.num_splits > 1;
  // Split-KV partials leave the sink out: the merge adds it once.
  const float sink_log2 =
      split_partial ? -INFINITY : sink_logit(p.softmax_type, p.softmax_offset, head) * kLog2e;
  float row_max[kSlabs][2], row_sum[kSlabs][2];
#pragma unroll
  for (int s = 0; s < kSlabs; ++s)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      row_max[s][half] = sink_log2;
      row_sum[s][half] = (sink_log2 != -INFINITY && quad_col == 0) ? 1.f : 0.f;
    }
  float o_acc[kSlabs][kVTiles][4];
#pragma unroll
  for (int s = 0; s < kSlabs; ++s)
#pragma unroll
    for (int t = 0; t < kVTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[s][t][e] = 0.f;

  const float alibi_slope =
      p.alibi_slopes ? p.alibi_slopes[batch * p.alibi_batch_stride + head] * kLog2e : 0.f;
  const int diagonal = p.bottom_right ? seqlen_kv - seqlen_q : 0;

  const uint32_t q_lane =
      ptx::shared_address(q_shared + (warp_row0 + lane % 16) * kQStride + (lane / 16) * 8);
  const uint32_t k_lane = ptx::shared_address(k_shared + ((lane / 16) * 8 + lane % 8) * kKStride +
                                              ((lane / 8) % 2) * 8);
  const uint32_t v_lane = ptx::shared_address(v_shared + (lane % 16) * kVStride + (lane / 16) * 8);
  constexpr int kBytes = int(sizeof(Element));

  // Prologue: Q and the first K tile.
  load_tile_async<Traits, kBlockM, kDimQK, kQStride>(q_shared, q_global, p.q_row_stride, rows_here);
  if (n_block_begin < n_block_end)
    load_tile_async<Traits, kBlockN, kDimQK, kKStride>(
        k_shared, k_global + int64_t(n_block_begin) * kBlockN * p.k_row_stride, p.k_row_stride,
        seqlen_kv - n_block_begin * kBlockN);
  ptx::cp_async_commit();

  for (int n_block = n_block_begin; n_block < n_block_end; ++n_block) {
    const int n0 = n_block * kBlockN;
    ptx::cp_async_wait<0>();
    __syncthreads();  // K(n) landed; every warp is done with V(n-1)
    load_tile_async<Traits, kBlockN, kDimV, kVStride>(v_shared, v_global + n0 * p.v_row_stride,
                                                      p.v_row_stride, seqlen_kv - n0);
    ptx::cp_async_commit();

    // Dropout keep bits of this tile, drawn before S exists: Philox's registers then do not
    // compete with the S accumulators. A thread's keys 2 quad_col + {0, 1} of each 8-key
    // Philox block are the low and high halves of word quad_col (selected by compares so the
    // block stays in registers); bit 2t (+1) of keep_bits[s][half] is key 8t + 2 quad_col (+1).
    static_assert(2 * kNTiles <= 32, "keep bits of one row must fit a 32-bit word");
    uint32_t keep_bits[kSlabs][2] = {};
    if (p.dropout_threshold != 0) {
#pragma unroll
      for (int s = 0; s < kSlabs; ++s)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = m0 + warp_row0 + s * 16 + quad_row + 8 * half;
#pragma unroll 1
          for (int t = 0; t < kNTiles; ++t) {
            const Philox4 block =
                dropout_block(p.seed, p.offset, batch, p.heads_q, head, i, n0 + 8 * t);
            const uint32_t word = quad_col == 0   ? block.x[0]
                                  : quad_col == 1 ? block.x[1]
                                  : quad_col == 2 ? block.x[2]
                                                  : block.x[3];
            const uint32_t keep_low = (word & 0xffffu) >= p.dropout_threshold ? 1u : 0u;
            const uint32_t keep_high = (word >> 16) >= p.dropout_threshold ? 2u : 0u;
            keep_bits[s][half] |= (keep_low | keep_high) << (2 * t);
          }
        }
    }

    // S = Q K^T for this warp's slabs.
    float s_acc[kSlabs][kNTiles][4];
#pragma unroll
    for (int s = 0; s < kSlabs; ++s)
#pragma unroll
      for (int t = 0; t < kNTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) s_acc[s][t][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kDimQK / 16; ++kk) {
      uint32_t a[kSlabs][4];
#pragma unroll
      for (int s = 0; s < kSlabs; ++s)
        ptx::ldmatrix_x4(a[s], q_lane + (s * 16 * kQStride + kk * 16) * kBytes);
#pragma unroll
      for (int pair = 0; pair < kNTiles / 2; ++pair) {
        uint32_t b[4];
        ptx::ldmatrix_x4(b, k_lane + (pair * 16 * kKStride + kk * 16) * kBytes);
        const uint32_t b_even[2] = {b[0], b[1]}, b_odd[2] = {b[2], b[3]};
#pragma unroll
        for (int s = 0; s < kSlabs; ++s) {
          ptx::mma_m16n8k16<Element>(s_acc[s][2 * pair], a[s], b_even);
          ptx::mma_m16n8k16<Element>(s_acc[s][2 * pair + 1], a[s], b_odd);
        }
      }
    }

    // Logit transform and mask. Element (s, t, e) is row warp_row0 + 16 s + quad_row +
    // 8 (e / 2) of the block and key n0 + 8 t + 2 quad_col + e % 2. Each feature is one
    // branch around a whole loop: a test per element compiles to a branch per element.
    if (p.use_softcap) {
#pragma unroll
      for (int s = 0; s < kSlabs; ++s)
#pragma unroll
        for (int t = 0; t < kNTiles; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s_acc[s][t][e] = p.softcap_log2 * accurate_tanh(s_acc[s][t][e] * p.softcap_arg_scale);
    } else {
#pragma unroll
      for (int s = 0; s < kSlabs; ++s)
#pragma unroll
        for (int t = 0; t < kNTiles; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) s_acc[s][t][e] *= p.scale_log2;
    }
    if (p.alibi_slopes) {
#pragma unroll
      for (int s = 0; s < kSlabs; ++s)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = m0 + warp_row0 + s * 16 + quad_row + 8 * (e / 2);
#pragma unroll
          for (int t = 0; t < kNTiles; ++t) {
            const int j = n0 + 8 * t + 2 * quad_col + (e & 1);
            s_acc[s][t][e] -= alibi_slope * fabsf(float(i + diagonal - j));
          }
        }
    }
    // Rows past seqlen_q are never stored, so only real rows decide whether to mask.
    const bool tile_fully_visible = n0 >= last_row.begin && n0 + kBlockN <= first_row.end;
    if (!tile_fully_visible) {
#pragma unroll
      for (int s = 0; s < kSlabs; ++s)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = m0 + warp_row0 + s * 16 + quad_row + 8 * half;
          const VisibleRange range = visible_range(p, i, seqlen_q, seqlen_kv);
#pragma unroll
          for (int t = 0; t < kNTiles; ++t)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = n0 + 8 * t + 2 * quad_col + e;
              if (j < range.begin || j >= range.end) s_acc[s][t][2 * half + e] = -INFINITY;
            }
        }
    }

    // Online softmax.
#pragma unroll
    for (int s = 0; s < kSlabs; ++s) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float partial_max[kNTiles];
#pragma unroll
        for (int t = 0; t < kNTiles; ++t)
          partial_max[t] = fmaxf(s_acc[s][t][2 * half], s_acc[s][t][2 * half + 1]);
          // Tree reductions keep dependency chains short: two warps per scheduler hide little.
#pragma unroll
        for (int stride = kNTiles / 2; stride > 0; stride /= 2)
#pragma unroll
          for (int t = 0; t < stride; ++t)
            partial_max[t] = fmaxf(partial_max[t], partial_max[t + stride]);
        float tile_max = partial_max[0];
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[s][half], tile_max);
        // A row that has seen only masked keys (and no sink) keeps max -inf: shift by 0 so
        // exp2(-inf - shift) = 0 instead of NaN.
        const float shift = new_max == -INFINITY ? 0.f : new_max;
        const float correction = fast_exp2(row_max[s][half] - shift);
        row_max[s][half] = new_max;
        float partial_sum[kNTiles];
#pragma unroll
        for (int t = 0; t < kNTiles; ++t) {
          const float p0 = fast_exp2(s_acc[s][t][2 * half] - shift);
          const float p1 = fast_exp2(s_acc[s][t][2 * half + 1] - shift);
          s_acc[s][t][2 * half] = p0;
          s_acc[s][t][2 * half + 1] = p1;
          partial_sum[t] = p0 + p1;
        }
#pragma unroll
        for (int stride = kNTiles / 2; stride > 0; stride /= 2)
#pragma unroll
          for (int t = 0; t < stride; ++t) partial_sum[t] += partial_sum[t + stride];
        const float tile_sum = partial_sum[0];
        row_sum[s][half] = row_sum[s][half] * correction + tile_sum;
#pragma unroll
        for (int t = 0; t < kVTiles; ++t) {
          o_acc[s][t][2 * half] *= correction;
          o_acc[s][t][2 * half + 1] *= correction;
        }
      }
    }

    // Dropout scales what multiplies V, not the normaliser (DESIGN.md §3.7).
    if (p.dropout_threshold != 0) {
#pragma unroll
      for (int s = 0; s < kSlabs; ++s)
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int t = 0; t < kNTiles; ++t) {
            const uint32_t bits = keep_bits[s][half] >> (2 * t);
            s_acc[s][t][2 * half] *= bits & 1u ? p.dropout_scale : 0.f;
            s_acc[s][t][2 * half + 1] *= bits & 2u ? p.dropout_scale : 0.f;
          }
    }

    ptx::cp_async_wait<0>();
    __syncthreads();  // V(n) landed; every warp is done with K(n)
    if (n_block + 1 < n_block_end)
      load_tile_async<Traits, kBlockN, kDimQK, kKStride>(
          k_shared, k_global + int64_t(n0 + kBlockN) * p.k_row_stride, p.k_row_stride,
          seqlen_kv - n0 - kBlockN);
    ptx::cp_async_commit();

    // O += P V: P (the S accumulators, rounded to Element) is the A operand directly.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[kSlabs][4];
#pragma unroll
      for (int s = 0; s < kSlabs; ++s) {
        a[s][0] = ptx::pack2<Element>(s_acc[s][2 * kk][0], s_acc[s][2 * kk][1]);
        a[s][1] = ptx::pack2<Element>(s_acc[s][2 * kk][2], s_acc[s][2 * kk][3]);
        a[s][2] = ptx::pack2<Element>(s_acc[s][2 * kk + 1][0], s_acc[s][2 * kk + 1][1]);
        a[s][3] = ptx::pack2<Element>(s_acc[s][2 * kk + 1][2], s_acc[s][2 * kk + 1][3]);
      }
#pragma unroll
      for (int pair = 0; pair < kVTiles / 2; ++pair) {
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, v_lane + (kk * 16 * kVStride + pair * 16) * kBytes);
        const uint32_t b_even[2] = {b[0], b[1]}, b_odd[2] = {b[2], b[3]};
#pragma unroll
        for (int s = 0; s < kSlabs; ++s) {
          ptx::mma_m16n8k16<Element>(o_acc[s][2 * pair], a[s], b_even);
          ptx::mma_m16n8k16<Element>(o_acc[s][2 * pair + 1], a[s], b_odd);
        }
      }
    }
  }

  // Epilogue: finish the row sums across the quad, normalise, store O and LSE.
#pragma unroll
  for (int s = 0; s < kSlabs; ++s)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = row_sum[s][half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int i = m0 + warp_row0 + s * 16 + quad_row + 8 * half;
      if (i >= seqlen_q) continue;
      const float inverse = sum > 0.f ? 1.f / sum : 0.f;
      const float lse = sum > 0.f ? (row_max[s][half] + __log2f(sum)) * kLn2 : -INFINITY;
      if (!split_partial) {
        Element* o_row = static_cast<Element*>(p.o) + batch * p.o_batch_stride +
                         ((p.start_q ? p.start_q[batch] : 0) + i) * p.o_row_stride +
                         head * p.o_head_stride;
#pragma unroll
        for (int t = 0; t < kVTiles; ++t) {
          const uint32_t pair = ptx::pack2<Element>(o_acc[s][t][2 * half] * inverse,
                                                    o_acc[s][t][2 * half + 1] * inverse);
          *reinterpret_cast<uint32_t*>(o_row + 8 * t + 2 * quad_col) = pair;
        }
        if (quad_col == 0)
          p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride +
                (p.start_q ? p.start_q[batch] : 0) + i] = lse;
      } else {
        const int64_t row =
            ((int64_t(split) * p.batch + batch) * p.heads_q + head) * p.max_seqlen_q + i;
        float* o_row = p.partial_o + row * kDimV;
#pragma unroll
        for (int t = 0; t < kVTiles; ++t)
          *reinterpret_cast<float2*>(o_row + 8 * t + 2 * quad_col) =
              make_float2(o_acc[s][t][2 * half] * inverse, o_acc[s][t][2 * half + 1] * inverse);
        if (quad_col == 0) p.partial_lse[row] = lse;
      }
    }
}

}  // namespace dpa::cuda
