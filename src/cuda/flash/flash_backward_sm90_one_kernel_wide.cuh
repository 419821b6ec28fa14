// The single-kernel wgmma backward for head dim 256 (sm_90a): the one-kernel backward's five GEMMs
// per tile (flash_backward_sm90_one_kernel.cuh) with the work split so that the accumulators fit.
// At d = 256 one warpgroup cannot hold dk and dv of 64 keys (256 fp32 registers per thread), so
// both consumer warpgroups own the same 64 keys and split the head dim: consumer c keeps
// columns [128c, 128c + 128) of dk and dv (128 registers).
//
// A block owns 64 keys of one (batch, KV head); a producer warpgroup copies K and V once and, per
// (query head, 64-row query tile), Q, dO and the rows' LSE and D into two stages (cp.async). Per
// tile, consumer c
//   - computes its 32 query columns of S^T = K Q^T and dP^T = V dO^T (shared x shared, K-major,
//     N = 32), then P^T and dU^T in registers, as the one-kernel backward does;
//   - writes those columns of P^T and dU^T (key-major, 128-byte swizzle, double-buffered) to
//     shared memory; a named barrier of both consumers makes the whole 64 x 64 tiles visible;
//   - issues dv[:, c] += P^T dO[:, c] and dk[:, c] += dU^T Q[:, c] (A K-major and B MN-major,
//     both in shared memory), and dq_tile = dU K[:, c] (both MN-major);
//   - adds dq_tile (64 rows x its 128 columns) to the fp32 workspace with 16-byte reductions
//     (red.global.add.v4.f32, two lanes of a quad trading a pair so each holds four adjacent
//     columns of one row).
// The shared memory is full (K, V, two stages of Q and dO: 192 KB, plus 32 KB of P^T / dU^T
// buffers), so dq is not staged there as the narrow one-kernel backward stages it.
// launch_flash_backward_sm90 then converts the workspace to dq (times scale). Deterministic mode
// and dropout keep the mma.sync pair at this head dim (flash_backward_family): the narrow form's
// keep words (2 x 512 bytes here) do not fit beside the full shared memory.
#pragma once

#include "cuda/flash/flash_backward_sm90_one_kernel.cuh"

namespace dpa::cuda {

template <typename ElementT, int kHeadDimQKT, int kHeadDimVT>
struct FlashBackwardSm90OneKernelWideTraits {
  using Element = ElementT;
  static constexpr int kHeadDimQK = kHeadDimQKT, kHeadDimV = kHeadDimVT;
  static constexpr int kThreads = 384;  // producer warpgroup + two consumers
  static constexpr int kConsumerThreads = 256;
  static constexpr int kStages = 2;
  static constexpr int kBlockN = 64, kBlockM = 64;
  static constexpr int kColumns = kHeadDimQK / 2;    // dk, dv and dq columns per consumer
  static constexpr int kQueryColumns = kBlockM / 2;  // S^T columns per consumer
  static constexpr int kOperandTileBytes = kBlockN * kBlockM * 2;  // one P^T or dU^T tile
  static constexpr int kBarrierBytes = 64;
  // K and V, kStages of Q and dO and of the rows' LSE and D, two buffers each of P^T and dU^T,
  // barriers, 1 KB of alignment.
  static constexpr int kSharedBytes = 2 * (kBlockN + kStages * kBlockM) * (kHeadDimQK + kHeadDimV) +
                                      kStages * 2 * kBlockM * 4 + 4 * kOperandTileBytes +
                                      kBarrierBytes + 1024;
  static_assert(flash_backward_one_kernel_wide_eligible(kHeadDimQK, kHeadDimV), "head dim 256");
  static_assert(kColumns % 64 == 0, "a consumer's columns are whole 64-column swizzle blocks");
  static_assert(kBlockM * 2 == 128, "P^T and dU^T rows are one 128-byte swizzle block");
  static_assert(2 * kStages + 1 <= kBarrierBytes / 8, "mbarriers fit their slot");
  static_assert(kSharedBytes <= 227 * 1024, "tiles must fit sm_90 shared memory");
  static_assert(kSharedBytes == flash_backward_one_kernel_shared_bytes(kHeadDimQK, kHeadDimV),
                "flash_tiles.h's size (the selector's rule) matches this layout");
};

// Shared-memory addresses of a wide one-kernel backward block.
template <typename Traits>
struct OneKernelWideBackwardLayout {
  static constexpr int kBlockN = Traits::kBlockN, kBlockM = Traits::kBlockM;
  static constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  static constexpr int kStages = Traits::kStages;
  uint32_t k, v, stages, operands, barriers;
  float *lse, *delta;  // kStages x kBlockM each

  __device__ explicit OneKernelWideBackwardLayout(unsigned char* storage) {
    const uint32_t base = (ptx::shared_address(storage) + 1023u) & ~1023u;
    k = base;
    v = k + kBlockN * kDimQK * 2;
    stages = v + kBlockN * kDimV * 2;
    operands = stages + kStages * kBlockM * (kDimQK + kDimV) * 2;
    const uint32_t statistics = operands + 4 * Traits::kOperandTileBytes;
    lse = reinterpret_cast<float*>(storage + (statistics - ptx::shared_address(storage)));
    delta = lse + kStages * kBlockM;
    barriers = statistics + kStages * 2 * kBlockM * 4;
  }
  __device__ uint32_t q(int stage) const { return stages + uint32_t(stage) * kBlockM * kDimQK * 2; }
  __device__ uint32_t d_o(int stage) const {
    return stages + kStages * kBlockM * kDimQK * 2 + uint32_t(stage) * kBlockM * kDimV * 2;
  }
  // P^T and dU^T of buffer 0 or 1 (key-major: 64 key rows of 64 queries).
  __device__ uint32_t pt(int buffer) const {
    return operands + uint32_t(2 * buffer) * Traits::kOperandTileBytes;
  }
  __device__ uint32_t dut(int buffer) const { return pt(buffer) + Traits::kOperandTileBytes; }
  __device__ uint32_t full(int stage) const { return barriers + 8u * stage; }
  __device__ uint32_t empty(int stage) const { return barriers + 8u * (kStages + stage); }
  __device__ uint32_t kv() const { return barriers + 8u * (2 * kStages); }
};

// Adds a consumer's dq tile (iteration it's 64 query rows; `row` the thread's first, columns
// [column0, column0 + kN)) to the fp32 workspace of rows of kDimQK. Lanes q and q ^ 1 of a quad
// trade one pair per n8 tile: the even lane then holds four adjacent columns of row g, the odd one
// of row g + 8.
template <int kDimQK, int kN>
__device__ __forceinline__ void add_dq_tile(const FlashBackwardParams& bp, const KeyBlock& kb,
                                            int it, const float (&dq_tile)[kN / 8][4], int row,
                                            int quad_col, int column0) {
  const FlashForwardParams& p = bp.fwd;
  const bool odd = quad_col & 1;
  const int i = kb.first_query(it) + row + (odd ? 8 : 0);
  const int column = column0 + 2 * (quad_col & ~1);
  const bool inside = i < kb.seqlen_q;
  float* accum =
      bp.dq_accum + row_workspace_index(p, kb.batch, kb.head(it), inside ? i : 0) * kDimQK + column;
#pragma unroll
  for (int t = 0; t < kN / 8; ++t) {
    const float send0 = odd ? dq_tile[t][0] : dq_tile[t][2];
    const float send1 = odd ? dq_tile[t][1] : dq_tile[t][3];
    const float got0 = __shfl_xor_sync(0xffffffffu, send0, 1);
    const float got1 = __shfl_xor_sync(0xffffffffu, send1, 1);
    const float4 sum = odd ? make_float4(got0, got1, dq_tile[t][2], dq_tile[t][3])
                           : make_float4(dq_tile[t][0], dq_tile[t][1], got0, got1);
    if (inside) ptx::red_add_v4(accum + 8 * t, sum);
  }
}

// The wide kernel's S^T or dP^T columns: acc = A B^T over kK with A the block's 64 key rows (a
// K-major tile of 64 rows) and B the 32 query rows from b_row0 of a K-major tile of 64 rows.
template <typename Element, int kN, int kK>
__device__ __forceinline__ void wgmma_key_rows_by_query_rows(float (&acc)[kN / 8][4],
                                                             uint32_t a_tile, uint32_t b_tile,
                                                             int b_row0) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    ptx::wgmma_ss<Element, kN>(acc, k_major_descriptor(a_tile, 64, 0, kk),
                               k_major_descriptor(b_tile, 64, b_row0, kk), kk > 0);
}

// acc += A B over the 64 queries: A a key-major tile (P^T or dU^T, K-major: 64 key rows of 64
// queries), B the query rows of a Q or dO stage (MN-major over its columns from `b_columns`,
// 64 rows per 64-column block).
template <typename Element, int kN>
__device__ __forceinline__ void wgmma_keys_by_queries(float (&acc)[kN / 8][4], uint32_t a_tile,
                                                      uint32_t b_columns) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    ptx::wgmma_ss_b_mn_major<Element, kN>(acc, k_major_descriptor(a_tile, 64, 0, kk),
                                          mn_major_descriptor(b_columns, 64, kk), true);
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_backward_one_kernel_wide_sm90_kernel(const __grid_constant__ FlashBackwardParams bp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  const FlashForwardParams& p = bp.fwd;
  constexpr int kBlockN = Traits::kBlockN, kBlockM = Traits::kBlockM;
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  constexpr int kStages = Traits::kStages, kConsumerThreads = Traits::kConsumerThreads;
  constexpr int kColumns = Traits::kColumns, kQueryColumns = Traits::kQueryColumns;
  constexpr int kMTiles = kQueryColumns / 8;

  extern __shared__ __align__(1024) unsigned char shared_storage[];
  const OneKernelWideBackwardLayout<Traits> l(shared_storage);

  KeyBlock kb;
  if (!make_key_block(p, kBlockN, kBlockM, kb)) return;
  init_key_block_barriers<Traits>(bp, l);
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    ptx::setmaxnreg_decrease<40>();
    if (kb.iterations > 0)
      produce_key_block_iterations<Traits, true>(
          bp, kb, l, [](int, int) {}, [](int) {});
    return;
  }

  ptx::setmaxnreg_increase<232>();
  const int consumer = warpgroup - 1;
  const int warp_in_group = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int key_row = warp_in_group * 16 + quad_row;  // in the block (both consumers)
  const int key0 = kb.j0 + key_row;
  const int query_column0 = consumer * kQueryColumns;  // this consumer's S^T columns
  const int column0 = consumer * kColumns;             // its dk, dv and dq columns
  // Its columns of a tile of 64 rows: whole 64-column blocks of 64 x 128 bytes.
  const uint32_t column_offset = uint32_t(column0 / 64) * 64 * 128;

  float dk_acc[kColumns / 8][4], dv_acc[kColumns / 8][4];
  zero_fragments(dk_acc);
  zero_fragments(dv_acc);
  if (kb.iterations > 0) {
    ptx::mbarrier_wait(l.kv(), 0);
    ptx::fence_proxy_async_shared();
#pragma unroll 1
    for (int it = 0; it < kb.iterations; ++it) {
      const int stage = it % kStages, buffer = it % 2;
      ptx::mbarrier_wait(l.full(stage), (it / kStages) & 1);
      // cp.async wrote Q and dO through the generic proxy; TMA writes through the async one.
      if (!bp.tma_query_tiles) ptx::fence_proxy_async_shared();

      // This consumer's columns of S^T = K Q^T and dP^T = V dO^T (P^T is computed while dP^T
      // runs).
      float s[kMTiles][4], dp[kMTiles][4];
      uint32_t derivative[kMTiles][2];
      ptx::wgmma_fence();
      wgmma_key_rows_by_query_rows<Element, kQueryColumns, kDimQK>(s, l.k, l.q(stage),
                                                                   query_column0);
      ptx::wgmma_commit();
      wgmma_key_rows_by_query_rows<Element, kQueryColumns, kDimV>(dp, l.v, l.d_o(stage),
                                                                  query_column0);
      ptx::wgmma_commit();

      const KeyTile key_tile = key_tile_of(p, kb, it);
      const int i0 = kb.first_query(it) + query_column0, warp_key0 = key0 - quad_row;
      const bool fully_visible =
          tile_fully_visible(p, key_tile, i0, i0 + kQueryColumns - 1, warp_key0, warp_key0 + 15);
      ptx::wgmma_wait<1>();
      ptx::fence_accumulators(s);
      key_tile_probabilities_no_dropout(p, key_tile, s, derivative, key0, i0, quad_col,
                                        l.lse + stage * kBlockM + query_column0, fully_visible);
      ptx::wgmma_wait<0>();
      ptx::fence_accumulators(dp);
      key_tile_gradients(p, s, dp, derivative, quad_col, l.delta + stage * kBlockM + query_column0);
      {
        uint32_t operand[kQueryColumns / 16][4];
        pack_operands<Element>(s, operand);
        store_key_major_operands(l.pt(buffer), operand, key_row, quad_col, query_column0 / 8);
        pack_operands<Element>(dp, operand);
        store_key_major_operands(l.dut(buffer), operand, key_row, quad_col, query_column0 / 8);
      }
      // Both consumers' columns are written (and, two iterations back, were last read: each
      // consumer waits for its products before the next iteration's barrier).
      ptx::fence_proxy_async_shared();
      ptx::named_barrier_sync(1, kConsumerThreads);

      // dv += P^T dO and dk += dU^T Q over this consumer's columns; then dq_tile = dU K.
      ptx::fence_accumulators(dk_acc);
      ptx::fence_accumulators(dv_acc);
      ptx::wgmma_fence();
      wgmma_keys_by_queries<Element, kColumns>(dv_acc, l.pt(buffer), l.d_o(stage) + column_offset);
      wgmma_keys_by_queries<Element, kColumns>(dk_acc, l.dut(buffer), l.q(stage) + column_offset);
      ptx::wgmma_commit();
      float dq_tile[kColumns / 8][4];
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk)
        ptx::wgmma_ss_mn_major<Element, kColumns>(
            dq_tile, mn_major_descriptor(l.dut(buffer), kBlockN, kk),
            mn_major_descriptor(l.k + column_offset, kBlockN, kk), kk > 0);
      ptx::wgmma_commit();
      ptx::wgmma_wait<1>();  // dv and dk are done; dq may still run
      ptx::fence_accumulators(dk_acc);
      ptx::fence_accumulators(dv_acc);
      ptx::mbarrier_arrive(l.empty(stage));  // Q, dO, LSE, D of this iteration are read

      ptx::wgmma_wait<0>();
      ptx::fence_accumulators(dq_tile);
      add_dq_tile<kDimQK, kColumns>(bp, kb, it, dq_tile, warp_in_group * 16 + quad_row, quad_col,
                                    column0);
    }
  }

  store_key_rows<Element, kColumns>(kb, dk_acc, bp.scale, key0, quad_col,
                                    static_cast<Element*>(bp.dk) + column0, bp.dk_batch_stride,
                                    bp.dk_row_stride, bp.dk_head_stride);
  store_key_rows<Element, kColumns>(kb, dv_acc, 1.f, key0, quad_col,
                                    static_cast<Element*>(bp.dv) + column0, bp.dv_batch_stride,
                                    bp.dv_row_stride, bp.dv_head_stride);
#else
  (void)bp;  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace dpa::cuda
