// The mma.sync flash forward kernel family (sm_80+): tiled online softmax on tensor cores
// (mma.sync m16n8k16, ldmatrix, cp.async), with softcap, sinks, masks/windows, varlen, GQA,
// ALiBi and dropout as runtime switches. Templated on the element type and the head dims only
// (STYLE.md). The per-tile math is shared with the wgmma family (flash_tile_math.cuh).
//
// A block owns kBlockM query rows of one (batch, head); each warp owns kSlabs slabs of 16
// rows. Per KV tile of kBlockN keys: S = Q K^T (fp32), the logit transform and mask, an
// online-softmax update of the running max m and sum l, then O += P V. K and V use one
// shared-memory buffer each, loaded alternately with cp.async (FlashAttention-2's schedule):
// V(n) streams in during S(n) = Q K(n)^T and K(n+1) during O += P V(n).
#pragma once

#include "cuda/flash/flash_tile_math.cuh"
#include "cuda/flash/flash_traits.h"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/ldmatrix.cuh"

namespace dpa::cuda {

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

  FlashBlock<Element> b;
  if (!make_flash_block(p, kBlockM, kBlockN, b)) return;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int warp_row0 = warp * 16 * kSlabs;  // first row of this warp within the block
  auto slab_row0 = [&](int s) { return b.m0 + warp_row0 + s * 16 + quad_row; };

  const float sink_log2 = block_sink_log2(p, b.head);
  RowStats stats[kSlabs];
  float o_acc[kSlabs][kVTiles][4];
#pragma unroll
  for (int s = 0; s < kSlabs; ++s) {
    stats[s] = initial_row_stats(sink_log2, quad_col);
#pragma unroll
    for (int t = 0; t < kVTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[s][t][e] = 0.f;
  }

  const uint32_t q_lane =
      ptx::shared_address(q_shared + (warp_row0 + lane % 16) * kQStride + (lane / 16) * 8);
  const uint32_t k_lane = ptx::shared_address(k_shared + ((lane / 16) * 8 + lane % 8) * kKStride +
                                              ((lane / 8) % 2) * 8);
  const uint32_t v_lane = ptx::shared_address(v_shared + (lane % 16) * kVStride + (lane / 16) * 8);
  constexpr int kBytes = int(sizeof(Element));

  // Prologue: Q and the first K tile.
  load_tile_async<Traits, kBlockM, kDimQK, kQStride>(q_shared, b.q, p.q_row_stride, b.rows_here);
  if (b.n_block_begin < b.n_block_end)
    load_tile_async<Traits, kBlockN, kDimQK, kKStride>(
        k_shared, b.k + int64_t(b.n_block_begin) * kBlockN * p.k_row_stride, p.k_row_stride,
        b.seqlen_kv - b.n_block_begin * kBlockN);
  ptx::cp_async_commit();

  for (int n_block = b.n_block_begin; n_block < b.n_block_end; ++n_block) {
    const int n0 = n_block * kBlockN;
    ptx::cp_async_wait<0>();
    __syncthreads();  // K(n) landed; every warp is done with V(n-1)
    load_tile_async<Traits, kBlockN, kDimV, kVStride>(v_shared, b.v + n0 * p.v_row_stride,
                                                      p.v_row_stride, b.seqlen_kv - n0);
    ptx::cp_async_commit();

    uint32_t keep_bits[kSlabs][2] = {};
    if (p.dropout_threshold != 0) {
#pragma unroll
      for (int s = 0; s < kSlabs; ++s)
        draw_keep_bits<kNTiles>(p, b, slab_row0(s), n0, quad_col, keep_bits[s]);
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
        uint32_t bk[4];
        ptx::ldmatrix_x4(bk, k_lane + (pair * 16 * kKStride + kk * 16) * kBytes);
        const uint32_t b_even[2] = {bk[0], bk[1]}, b_odd[2] = {bk[2], bk[3]};
#pragma unroll
        for (int s = 0; s < kSlabs; ++s) {
          ptx::mma_m16n8k16<Element>(s_acc[s][2 * pair], a[s], b_even);
          ptx::mma_m16n8k16<Element>(s_acc[s][2 * pair + 1], a[s], b_odd);
        }
      }
    }

    // Rows past seqlen_q are never stored, so only real rows decide whether to mask.
    const bool fully_visible = n0 >= b.last_row.begin && n0 + kBlockN <= b.first_row.end;
#pragma unroll
    for (int s = 0; s < kSlabs; ++s)
      transform_logits(p, b, s_acc[s], slab_row0(s), n0, quad_col, fully_visible);
#pragma unroll
    for (int s = 0; s < kSlabs; ++s) online_softmax(s_acc[s], o_acc[s], stats[s], p.max_slack);
    if (p.dropout_threshold != 0) {
#pragma unroll
      for (int s = 0; s < kSlabs; ++s) apply_dropout(p, s_acc[s], keep_bits[s]);
    }

    ptx::cp_async_wait<0>();
    __syncthreads();  // V(n) landed; every warp is done with K(n)
    if (n_block + 1 < b.n_block_end)
      load_tile_async<Traits, kBlockN, kDimQK, kKStride>(
          k_shared, b.k + int64_t(n0 + kBlockN) * p.k_row_stride, p.k_row_stride,
          b.seqlen_kv - n0 - kBlockN);
    ptx::cp_async_commit();

    // O += P V: P (the S accumulators, rounded to Element) is the A operand directly.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[kSlabs][4];
#pragma unroll
      for (int s = 0; s < kSlabs; ++s) pack_p_operand<Element>(s_acc[s], kk, a[s]);
#pragma unroll
      for (int pair = 0; pair < kVTiles / 2; ++pair) {
        uint32_t bv[4];
        ptx::ldmatrix_x4_trans(bv, v_lane + (kk * 16 * kVStride + pair * 16) * kBytes);
        const uint32_t b_even[2] = {bv[0], bv[1]}, b_odd[2] = {bv[2], bv[3]};
#pragma unroll
        for (int s = 0; s < kSlabs; ++s) {
          ptx::mma_m16n8k16<Element>(o_acc[s][2 * pair], a[s], b_even);
          ptx::mma_m16n8k16<Element>(o_acc[s][2 * pair + 1], a[s], b_odd);
        }
      }
    }
  }

#pragma unroll
  for (int s = 0; s < kSlabs; ++s) store_slab(p, b, o_acc[s], stats[s], slab_row0(s), quad_col);
}

}  // namespace dpa::cuda
