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

template <int kTiles>
__device__ __forceinline__ void zero_fragments(float (&f)[kTiles][4]) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) f[t][e] = 0.f;
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
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = row0 + 8 * half;
    lse2[half] = row_lse_log2(p, b.batch, b.head, i, b.seqlen_q);
    delta[half] = i < b.seqlen_q ? bp.row_delta[row_workspace_index(p, b.batch, b.head, i)] : 0.f;
  }

  const int64_t q_row0 = (p.start_q ? p.start_q[b.batch] : 0) + b.m0;
  const Element* d_o = static_cast<const Element*>(bp.d_o) + b.batch * bp.do_batch_stride +
                       q_row0 * bp.do_row_stride + b.head * bp.do_head_stride;
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
#pragma unroll
    for (int kk = 0; kk < kDimQK / 16; ++kk)
      ptx::wgmma_ss<Element, kBlockN>(s, k_major_descriptor(q_shared, kBlockM, warpgroup * 64, kk),
                                      k_major_descriptor(k_shared(stage), kBlockN, 0, kk), kk > 0);
    ptx::wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kDimV / 16; ++kk)
      ptx::wgmma_ss<Element, kBlockN>(dp,
                                      k_major_descriptor(do_shared, kBlockM, warpgroup * 64, kk),
                                      k_major_descriptor(v_shared(stage), kBlockN, 0, kk), kk > 0);
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
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      ptx::wgmma_rs<Element, kDimQK>(dq_acc, du_operand[kk],
                                     mn_major_descriptor(k_shared(stage), kBlockN, kk), true);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::fence_accumulators(dq_acc);
    ptx::fence_registers(du_operand);
  }
  ptx::cp_async_wait<0>();

  const int64_t q_start = p.start_q ? p.start_q[b.batch] : 0;
  store_fragment_rows<Element, kDimQK>(dq_acc, bp.scale, row0, quad_col, [&](int i) -> Element* {
    if (i >= b.seqlen_q) return nullptr;
    return static_cast<Element*>(bp.dq) + b.batch * bp.dq_batch_stride +
           (q_start + i) * bp.dq_row_stride + b.head * bp.dq_head_stride;
  });
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

  const int batch = blockIdx.z, kv_head = blockIdx.y;
  const int seqlen_q = p.seqlen_q[batch], seqlen_kv = p.seqlen_kv[batch];
  const int j0 = blockIdx.x * kBlockN;
  if (j0 >= seqlen_kv) return;
  const int keys_here = min(kBlockN, seqlen_kv - j0);
  const int diagonal = p.diagonal[batch];
  const int warpgroup = threadIdx.x / 128;
  const int warp_in_group = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int warp_key0 = j0 + warpgroup * 64 + warp_in_group * 16;
  const int key0 = warp_key0 + quad_row;

  // Query rows that can see a key of this block (as the mma.sync kernel).
  const int last_key = j0 + keys_here - 1;
  const QueryRange queries =
      queries_seeing_keys(j0, last_key, seqlen_q, diagonal, p.window_left, p.window_right);
  const int i_first = queries.first, i_last = queries.last;
  const int m_begin = i_first / kBlockM;
  const int m_tiles = i_last >= i_first ? i_last / kBlockM + 1 - m_begin : 0;
  const int group = p.group_size;
  const int iterations = m_tiles * group;

  const int64_t q_start = p.start_q ? p.start_q[batch] : 0;
  const int64_t kv_start = p.start_kv ? p.start_kv[batch] : 0;
  const Element* k_rows = static_cast<const Element*>(p.k) + batch * p.k_batch_stride +
                          (kv_start + j0) * p.k_row_stride + kv_head * p.k_head_stride;
  const Element* v_rows = static_cast<const Element*>(p.v) + batch * p.v_batch_stride +
                          (kv_start + j0) * p.v_row_stride + kv_head * p.v_head_stride;
  load_swizzled_tile_async<Element, kBlockN, kDimQK, kThreads>(k_shared, k_rows, p.k_row_stride,
                                                               keys_here);
  load_swizzled_tile_async<Element, kBlockN, kDimV, kThreads>(v_shared, v_rows, p.v_row_stride,
                                                              keys_here);

  auto load_queries = [&](int it, int stage) {
    const int head = kv_head * group + it / m_tiles;
    const int i0 = (m_begin + it % m_tiles) * kBlockM;
    const Element* q_rows = static_cast<const Element*>(p.q) + batch * p.q_batch_stride +
                            (q_start + i0) * p.q_row_stride + head * p.q_head_stride;
    const Element* do_rows = static_cast<const Element*>(bp.d_o) + batch * bp.do_batch_stride +
                             (q_start + i0) * bp.do_row_stride + head * bp.do_head_stride;
    load_swizzled_tile_async<Element, kBlockM, kDimQK, kThreads>(q_shared(stage), q_rows,
                                                                 p.q_row_stride, seqlen_q - i0);
    load_swizzled_tile_async<Element, kBlockM, kDimV, kThreads>(do_shared(stage), do_rows,
                                                                bp.do_row_stride, seqlen_q - i0);
    for (int r = threadIdx.x; r < kBlockM; r += kThreads) {
      const int i = i0 + r;
      lse_stages[stage * kBlockM + r] = row_lse_log2(p, batch, head, i, seqlen_q);
      delta_stages[stage * kBlockM + r] =
          i < seqlen_q ? bp.row_delta[row_workspace_index(p, batch, head, i)] : 0.f;
    }
  };
  if (iterations > 0) load_queries(0, 0);
  ptx::cp_async_commit();

  float dk_acc[kDimQK / 8][4], dv_acc[kDimV / 8][4];
  zero_fragments(dk_acc);
  zero_fragments(dv_acc);

  for (int it = 0; it < iterations; ++it) {
    const int stage = it % 2;
    const int head = kv_head * group + it / m_tiles;
    const int i0 = (m_begin + it % m_tiles) * kBlockM;
    __syncthreads();  // every warp is done with iteration it - 1, whose stage is refilled next
    if (it + 1 < iterations) load_queries(it + 1, stage ^ 1);
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
    ptx::fence_proxy_async_shared();
    __syncthreads();  // this iteration's Q, dO, LSE and D (and K, V) are in shared memory
    const float alibi_slope =
        p.alibi_slopes ? p.alibi_slopes[batch * p.alibi_batch_stride + head] * kLog2e : 0.f;
    const KeyTile key_tile{batch, head, seqlen_q, seqlen_kv, diagonal, alibi_slope};
    if (p.dropout_threshold != 0)
      draw_key_tile_keep_masks(p, key_tile, i0, warp_key0, lane, keep_masks);

    // S^T = K Q^T and dP^T = V dO^T, issued together.
    float s[kMTiles][4], dp[kMTiles][4], derivative[kMTiles][4], p_dropped[kMTiles][4];
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDimQK / 16; ++kk)
      ptx::wgmma_ss<Element, kBlockM>(s, k_major_descriptor(k_shared, kBlockN, warpgroup * 64, kk),
                                      k_major_descriptor(q_shared(stage), kBlockM, 0, kk), kk > 0);
    ptx::wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kDimV / 16; ++kk)
      ptx::wgmma_ss<Element, kBlockM>(dp, k_major_descriptor(v_shared, kBlockN, warpgroup * 64, kk),
                                      k_major_descriptor(do_shared(stage), kBlockM, 0, kk), kk > 0);
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
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
      ptx::wgmma_rs<Element, kDimV>(dv_acc, pd_operand[kk],
                                    mn_major_descriptor(do_shared(stage), kBlockM, kk), true);
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();  // dP^T is ready (groups complete in order); dv may still run
    ptx::fence_accumulators(dp);
    key_tile_logit_gradients(p, s, dp, derivative, keep, delta_stages + stage * kBlockM, quad_col);

    // dk += dU^T Q.
    uint32_t du_operand[kBlockM / 16][4];
    pack_operands<Element>(s, du_operand);
    ptx::fence_accumulators(dk_acc);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
      ptx::wgmma_rs<Element, kDimQK>(dk_acc, du_operand[kk],
                                     mn_major_descriptor(q_shared(stage), kBlockM, kk), true);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::fence_accumulators(dk_acc);
    ptx::fence_accumulators(dv_acc);
    ptx::fence_registers(pd_operand);
    ptx::fence_registers(du_operand);
  }
  ptx::cp_async_wait<0>();

  auto key_row = [&](void* out, int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
    return [=](int j) -> Element* {
      if (j >= seqlen_kv) return nullptr;
      return static_cast<Element*>(out) + batch * batch_stride + (kv_start + j) * row_stride +
             kv_head * head_stride;
    };
  };
  store_fragment_rows<Element, kDimQK>(
      dk_acc, bp.scale, key0, quad_col,
      key_row(bp.dk, bp.dk_batch_stride, bp.dk_row_stride, bp.dk_head_stride));
  store_fragment_rows<Element, kDimV>(
      dv_acc, 1.f, key0, quad_col,
      key_row(bp.dv, bp.dv_batch_stride, bp.dv_row_stride, bp.dv_head_stride));
#else
  (void)bp;  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace dpa::cuda
