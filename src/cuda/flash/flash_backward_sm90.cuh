// The wgmma flash backward kernels (sm_90a): the two atomic-free kernels of
// flash_backward_kernel.cuh on warpgroup MMAs, with the per-tile math shared with them and the
// shared-memory machinery of the wgmma forward (128-byte-swizzled tiles written by cp.async,
// K-major and MN-major descriptors). Head dims up to 128 (both tiles' operands and the
// accumulators fit); wider heads keep the mma.sync kernels.
//
// - dq: two warpgroups of 64 query rows walk the visible key tiles (64 keys, two stages).
//   S = Q K^T and dP = dO V^T are shared x shared (K-major, the forward's Q K^T), issued
//   together; dq += dU K takes dU from registers and K as an MN-major operand (the forward's
//   P V).
// - dk/dv: two warpgroups of 64 keys walk the group's query heads and the query tiles (32 rows,
//   two stages) that see them. S^T = K Q^T and dP^T = V dO^T are shared x shared; dv += Pd^T dO
//   and dk += dU^T Q take the A operand from registers and dO, Q as MN-major operands.
#pragma once

#include "cuda/flash/flash_backward_kernel.cuh"
#include "cuda/flash/flash_forward_sm90.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace dpa::cuda {

template <typename ElementT, int kHeadDimQKT, int kHeadDimVT>
struct FlashBackwardSm90Traits {
  using Element = ElementT;
  static constexpr int kHeadDimQK = kHeadDimQKT, kHeadDimV = kHeadDimVT;
  static constexpr int kThreads = 256;  // two warpgroups
  static constexpr int kDqBlockM = 128, kDqBlockN = 64;
  static constexpr int kDkvBlockN = 128, kDkvBlockM = 32;
  // Q and dO of the block, two stages of K and V, 1 KB to align the base to the swizzle.
  static constexpr int kDqSharedBytes =
      2 * (kDqBlockM + 2 * kDqBlockN) * (kHeadDimQK + kHeadDimV) + 1024;
  // K and V of the block, two stages of Q and dO, their LSE and D, the 8 warps' keep masks.
  static constexpr int kDkvSharedBytes =
      2 * (kDkvBlockN + 2 * kDkvBlockM) * (kHeadDimQK + kHeadDimV) + 2 * 2 * kDkvBlockM * 4 +
      8 * 2 * kDkvBlockM + 1024;
  static_assert(flash_backward_wgmma_eligible(kHeadDimQK, kHeadDimV), "head dims 64 or 128");
  static_assert(kDqSharedBytes <= 227 * 1024 && kDkvSharedBytes <= 227 * 1024,
                "tiles must fit sm_90 shared memory");
  static_assert(flash_backward_max(kDqSharedBytes, kDkvSharedBytes) ==
                    flash_backward_wgmma_shared_bytes(kHeadDimQK, kHeadDimV),
                "flash_tiles.h's size (the selector's rule) matches this layout");
};

// Descriptor of a K-major operand: rows `row0..` of a swizzled tile of `rows` rows, 16 columns
// from 16 * kk (64-column blocks of rows x 128 bytes).
__device__ __forceinline__ uint64_t k_major_descriptor(uint32_t tile, int rows, int row0, int kk) {
  return ptx::smem_descriptor(tile + (kk / 4) * (rows * 128) + row0 * 128 + (kk % 4) * 32, 16,
                              1024);
}

// Descriptor of an MN-major B operand: 16 rows from 16 * kk of a swizzled tile of `rows` rows
// (the K dimension runs along the rows, N along the columns).
__device__ __forceinline__ uint64_t mn_major_descriptor(uint32_t tile, int rows, int kk) {
  return ptx::smem_descriptor(tile + kk * 16 * 128, rows * 128, 1024);
}

// acc (+)= A B^T over kK columns (the wgmma counterpart of mma_rows_by_rows): A is rows
// a_row0..a_row0+63 of a K-major tile of a_rows rows, B a K-major tile of kN rows. Issues only
// (no commit).
template <typename Element, int kN, int kK>
__device__ __forceinline__ void wgmma_rows_by_rows(float (&acc)[kN / 8][4], uint32_t a_tile,
                                                   int a_rows, int a_row0, uint32_t b_tile) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    ptx::wgmma_ss<Element, kN>(acc, k_major_descriptor(a_tile, a_rows, a_row0, kk),
                               k_major_descriptor(b_tile, kN, 0, kk), kk > 0);
}

// acc += F B (the counterpart of mma_fragments_by_rows): F packed register operands over kK,
// B an MN-major tile of kK rows. Issues only (no commit).
template <typename Element, int kN, int kK>
__device__ __forceinline__ void wgmma_fragments_by_rows(float (&acc)[kN / 8][4],
                                                        const uint32_t (&f)[kK / 16][4],
                                                        uint32_t b_tile) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    ptx::wgmma_rs<Element, kN>(acc, f[kk], mn_major_descriptor(b_tile, kK, kk), true);
}

template <typename Element, int kKTiles>
__device__ __forceinline__ void pack_operands(const float (&f)[kKTiles * 2][4],
                                              uint32_t (&a)[kKTiles][4]) {
#pragma unroll
  for (int kk = 0; kk < kKTiles; ++kk) pack_p_operand<Element>(f, kk, a[kk]);
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_backward_dq_sm90_kernel(const __grid_constant__ FlashBackwardParams bp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  const FlashForwardParams& p = bp.fwd;
  constexpr int kBlockM = Traits::kDqBlockM, kBlockN = Traits::kDqBlockN;
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  constexpr int kThreads = Traits::kThreads;
  constexpr int kNTiles = kBlockN / 8;

  extern __shared__ __align__(1024) unsigned char shared_storage[];
  const uint32_t base = (ptx::shared_address(shared_storage) + 1023u) & ~1023u;
  const uint32_t q_shared = base;
  const uint32_t do_shared = q_shared + kBlockM * kDimQK * 2;
  auto k_shared = [&](int stage) {
    return do_shared + kBlockM * kDimV * 2 + uint32_t(stage) * kBlockN * kDimQK * 2;
  };
  auto v_shared = [&](int stage) {
    return do_shared + kBlockM * kDimV * 2 + 2 * kBlockN * kDimQK * 2 +
           uint32_t(stage) * kBlockN * kDimV * 2;
  };

  FlashBlock<Element> b;
  if (!make_flash_block(p, kBlockM, kBlockN, b)) return;
  const int warpgroup = threadIdx.x / 128;
  const int warp_in_group = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int row0 = b.m0 + warpgroup * 64 + warp_in_group * 16 + quad_row;

  float lse2[2], delta[2];
  load_row_statistics(bp, b, row0, lse2, delta);
  const Element* d_o = block_d_o(bp, b);
  auto load_kv = [&](int n_block, int stage) {
    const int n0 = n_block * kBlockN;
    load_swizzled_tile_async<Element, kBlockN, kDimQK, kThreads>(
        k_shared(stage), b.k + int64_t(n0) * p.k_row_stride, p.k_row_stride, b.seqlen_kv - n0);
    load_swizzled_tile_async<Element, kBlockN, kDimV, kThreads>(
        v_shared(stage), b.v + int64_t(n0) * p.v_row_stride, p.v_row_stride, b.seqlen_kv - n0);
  };
  load_swizzled_tile_async<Element, kBlockM, kDimQK, kThreads>(q_shared, b.q, p.q_row_stride,
                                                               b.rows_here);
  load_swizzled_tile_async<Element, kBlockM, kDimV, kThreads>(do_shared, d_o, bp.do_row_stride,
                                                              b.rows_here);
  if (b.n_block_begin < b.n_block_end) load_kv(b.n_block_begin, 0);
  ptx::cp_async_commit();

  float dq_acc[kDimQK / 8][4];
  zero_fragments(dq_acc);

  for (int n_block = b.n_block_begin; n_block < b.n_block_end; ++n_block) {
    const int stage = (n_block - b.n_block_begin) % 2;
    const int n0 = n_block * kBlockN;
    __syncthreads();  // every warpgroup is done with tile n - 1, whose stage is refilled next
    if (n_block + 1 < b.n_block_end) load_kv(n_block + 1, stage ^ 1);
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
    ptx::fence_proxy_async_shared();
    __syncthreads();  // tile n (and Q, dO) landed and is visible to wgmma

    uint32_t keep[2] = {0u, 0u};
    if (p.dropout_threshold != 0) draw_keep_bits<kNTiles>(p, b, row0, n0, quad_col, keep);

    // S = Q K^T and dP = dO V^T, issued together.
    float s[kNTiles][4], dp[kNTiles][4], derivative[kNTiles][4];
    ptx::wgmma_fence();
    wgmma_rows_by_rows<Element, kBlockN, kDimQK>(s, q_shared, kBlockM, warpgroup * 64,
                                                 k_shared(stage));
    ptx::wgmma_commit();
    wgmma_rows_by_rows<Element, kBlockN, kDimV>(dp, do_shared, kBlockM, warpgroup * 64,
                                                v_shared(stage));
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();  // S is ready; dP may still run
    ptx::fence_accumulators(s);
    const bool fully_visible = n0 >= b.last_row.begin && n0 + kBlockN <= b.first_row.end;
    query_tile_probabilities(p, b, s, derivative, row0, n0, quad_col, lse2, fully_visible);
    ptx::wgmma_wait<0>();
    ptx::fence_accumulators(dp);
    query_tile_logit_gradients(p, s, dp, derivative, keep, delta);

    // dq += dU K (K as an MN-major operand: keys along K, head dim along N).
    uint32_t du_operand[kBlockN / 16][4];
    pack_operands<Element>(s, du_operand);
    ptx::fence_accumulators(dq_acc);
    ptx::wgmma_fence();
    wgmma_fragments_by_rows<Element, kDimQK, kBlockN>(dq_acc, du_operand, k_shared(stage));
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::fence_accumulators(dq_acc);
    ptx::fence_registers(du_operand);
  }
  ptx::cp_async_wait<0>();

  store_dq_rows<Element, kDimQK>(bp, b, dq_acc, row0, quad_col);
#else
  (void)bp;  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_backward_dkdv_sm90_kernel(const __grid_constant__ FlashBackwardParams bp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  const FlashForwardParams& p = bp.fwd;
  constexpr int kBlockN = Traits::kDkvBlockN, kBlockM = Traits::kDkvBlockM;
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  constexpr int kThreads = Traits::kThreads;
  constexpr int kMTiles = kBlockM / 8;

  extern __shared__ __align__(1024) unsigned char shared_storage[];
  const uint32_t base = (ptx::shared_address(shared_storage) + 1023u) & ~1023u;
  const uint32_t k_shared = base;
  const uint32_t v_shared = k_shared + kBlockN * kDimQK * 2;
  auto q_shared = [&](int stage) {
    return v_shared + kBlockN * kDimV * 2 + uint32_t(stage) * kBlockM * kDimQK * 2;
  };
  auto do_shared = [&](int stage) {
    return v_shared + kBlockN * kDimV * 2 + 2 * kBlockM * kDimQK * 2 +
           uint32_t(stage) * kBlockM * kDimV * 2;
  };
  // Generic pointers into the dynamic shared memory for the plain loads and stores.
  unsigned char* const aligned = shared_storage + (base - ptx::shared_address(shared_storage)) +
                                 2 * (kBlockN + 2 * kBlockM) * (kDimQK + kDimV);
  float* lse_stages = reinterpret_cast<float*>(aligned);  // 2 x kBlockM
  float* delta_stages = lse_stages + 2 * kBlockM;         // 2 x kBlockM
  uint8_t* keep_masks = reinterpret_cast<uint8_t*>(delta_stages + 2 * kBlockM) +
                        (threadIdx.x / 32) * 2 * kBlockM;  // this warp's

  KeyBlock kb;
  if (!make_key_block(p, kBlockN, kBlockM, kb)) return;
  const int warpgroup = threadIdx.x / 128;
  const int warp_in_group = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int warp_key0 = kb.j0 + warpgroup * 64 + warp_in_group * 16;
  const int key0 = warp_key0 + quad_row;

  load_swizzled_tile_async<Element, kBlockN, kDimQK, kThreads>(
      k_shared, key_block_rows<Element>(kb, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride),
      p.k_row_stride, kb.keys_here);
  load_swizzled_tile_async<Element, kBlockN, kDimV, kThreads>(
      v_shared, key_block_rows<Element>(kb, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride),
      p.v_row_stride, kb.keys_here);

  // Q, dO and the rows' LSE and D of iteration it.
  auto load_queries = [&](int it, int stage) {
    const int head = kb.head(it), i0 = kb.first_query(it);
    load_swizzled_tile_async<Element, kBlockM, kDimQK, kThreads>(
        q_shared(stage),
        query_tile_rows<Element>(kb, it, p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride),
        p.q_row_stride, kb.seqlen_q - i0);
    load_swizzled_tile_async<Element, kBlockM, kDimV, kThreads>(
        do_shared(stage),
        query_tile_rows<Element>(kb, it, bp.d_o, bp.do_batch_stride, bp.do_row_stride,
                                 bp.do_head_stride),
        bp.do_row_stride, kb.seqlen_q - i0);
    for (int r = threadIdx.x; r < kBlockM; r += kThreads) {
      lse_stages[stage * kBlockM + r] = row_lse_log2(p, kb.batch, head, i0 + r, kb.seqlen_q);
      delta_stages[stage * kBlockM + r] = row_delta_of(bp, kb.batch, head, i0 + r, kb.seqlen_q);
    }
  };
  if (kb.iterations > 0) load_queries(0, 0);
  ptx::cp_async_commit();

  float dk_acc[kDimQK / 8][4], dv_acc[kDimV / 8][4];
  zero_fragments(dk_acc);
  zero_fragments(dv_acc);

  for (int it = 0; it < kb.iterations; ++it) {
    const int stage = it % 2;
    const int i0 = kb.first_query(it);
    __syncthreads();  // every warp is done with iteration it - 1, whose stage is refilled next
    if (it + 1 < kb.iterations) load_queries(it + 1, stage ^ 1);
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
    ptx::fence_proxy_async_shared();
    __syncthreads();  // this iteration's Q, dO, LSE and D (and K, V) are in shared memory
    const KeyTile key_tile = key_tile_of(p, kb, it);
    if (p.dropout_threshold != 0)
      draw_key_tile_keep_masks(p, key_tile, i0, warp_key0, lane, keep_masks);

    // S^T = K Q^T and dP^T = V dO^T, issued together.
    float s[kMTiles][4], dp[kMTiles][4], derivative[kMTiles][4], p_dropped[kMTiles][4];
    ptx::wgmma_fence();
    wgmma_rows_by_rows<Element, kBlockM, kDimQK>(s, k_shared, kBlockN, warpgroup * 64,
                                                 q_shared(stage));
    ptx::wgmma_commit();
    wgmma_rows_by_rows<Element, kBlockM, kDimV>(dp, v_shared, kBlockN, warpgroup * 64,
                                                do_shared(stage));
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();  // S^T is ready; dP^T may still run
    ptx::fence_accumulators(s);
    uint32_t keep = 0;
    key_tile_probabilities(p, key_tile, s, derivative, p_dropped, keep, key0, i0, quad_row,
                           quad_col, lse_stages + stage * kBlockM, keep_masks);

    // dv += Pd^T dO (dO as an MN-major operand: queries along K, head dim along N).
    uint32_t pd_operand[kBlockM / 16][4];
    pack_operands<Element>(p_dropped, pd_operand);
    ptx::fence_accumulators(dv_acc);
    ptx::wgmma_fence();
    wgmma_fragments_by_rows<Element, kDimV, kBlockM>(dv_acc, pd_operand, do_shared(stage));
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();  // dP^T is ready (groups complete in order); dv may still run
    ptx::fence_accumulators(dp);
    key_tile_logit_gradients(p, s, dp, derivative, keep, delta_stages + stage * kBlockM, quad_col);

    // dk += dU^T Q.
    uint32_t du_operand[kBlockM / 16][4];
    pack_operands<Element>(s, du_operand);
    ptx::fence_accumulators(dk_acc);
    ptx::wgmma_fence();
    wgmma_fragments_by_rows<Element, kDimQK, kBlockM>(dk_acc, du_operand, q_shared(stage));
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::fence_accumulators(dk_acc);
    ptx::fence_accumulators(dv_acc);
    ptx::fence_registers(pd_operand);
    ptx::fence_registers(du_operand);
  }
  ptx::cp_async_wait<0>();

  store_key_block_gradients<Element, kDimQK, kDimV>(bp, kb, dk_acc, dv_acc, key0, quad_col);
#else
  (void)bp;  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace dpa::cuda
