// The single-kernel wgmma backward for head dims above 128 (sm_90a: 256, 192 and MLA's 192 / 128):
// the one-kernel backward's five GEMMs per tile (flash_backward_sm90_one_kernel.cuh) with the
// work split so that the accumulators fit. At d = 256 one warpgroup cannot hold dk and dv of 64
// keys (256 fp32 registers per thread), so both consumer warpgroups own the same 64 keys and split
// the head dims in 64-column blocks (flash_backward_wide_split): at 256 consumer c keeps columns
// [128c, 128c + 128) of dk and dv (128 registers); at 192 consumer 0 dk's first 128 columns and
// dv's first 64, consumer 1 the rest; at 192 / 128 consumer 0 dk's first 128 columns, consumer 1
// dk's last 64 and all of dv. Each consumer's dq columns are its dk columns.
//
// A block owns 64 keys of one (batch, KV head); a producer warpgroup copies K and V once and, per
// (query head, 64-row query tile), Q, dO and the rows' LSE and D into two stages (cp.async). Per
// tile, consumer c
//   - computes its 32 query columns of S^T = K Q^T and dP^T = V dO^T (shared x shared, K-major,
//     N = 32), then P^T and dU^T in registers, as the one-kernel backward does;
//   - writes those columns of P^T and dU^T (key-major, 128-byte swizzle, double-buffered) to
//     shared memory; a named barrier of both consumers makes the whole 64 x 64 tiles visible;
//   - issues dv[:, c] += P^T dO[:, c], dq_tile = dU K[:, c] (both MN-major), then
//     dk[:, c] += dU^T Q[:, c] (A K-major and B MN-major, both in shared memory), over its
//     columns of each;
//   - while dk runs, adds dq_tile (64 rows x its dk columns) to the fp32 workspace from its
//     registers (add_dq_fragments: 8-byte reductions, red.global.add.v2.f32), as the narrow
//     form does outside deterministic mode.
// At 256 the shared memory is full (K, V, two stages of Q and dO: 192 KB, plus 32 KB of P^T / dU^T
// buffers), so dq is never staged there, as the narrow form stages it in deterministic mode.
// launch_flash_backward_sm90 then converts the workspace to dq (times scale). kDeterministic:
// each dq tile is added in key-block order, as the narrow form's producer adds it (the grid in
// key-block chains; a flag per query tile, bp.dq_order), but from the consumers' registers: the
// producer's warp 3 waits until the tile's flag names this key block and arrives on the stage's
// dq_ready mbarrier, both consumers wait there, add their columns and arrive at a named barrier,
// and warp 3, waiting there, hands the tile on (hand_over_dq_tile). kDropout (192 and 192 / 128):
// the producer, otherwise idle between its copies, draws each query tile's keep bits into the stage
// in the narrow form's layout (draw_query_tile_keep_words for 64 keys: a word per (key group,
// quad row, quad column) with a bit per query of the tile), and each consumer reads its key
// group's word and its half of the bits. At 256 dropout keeps the mma.sync pair
// (flash_backward_family): two stages of keep words (1 KB) would overflow the shared memory by 64
// bytes.
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
  static_assert(kBlockN == flash_backward_one_kernel_block_n(kHeadDimQK, kHeadDimV) &&
                    kBlockM == kOneKernelBackwardBlockM,
                "the host sizes deterministic mode's flags and chains by these blocks");
  // Consumer 0's 64-column blocks of dk (and dq) and of dv; consumer 1 keeps the rest.
  static constexpr FlashBackwardWideSplit kSplit = flash_backward_wide_split(kHeadDimQK, kHeadDimV);
  static constexpr int kQueryColumns = kBlockM / 2;                // S^T columns per consumer
  static constexpr int kOperandTileBytes = kBlockN * kBlockM * 2;  // one P^T or dU^T tile
  static constexpr int kBarrierBytes = 64;
  // Deterministic mode: the consumers arrive here when a dq tile's reductions are issued, and
  // the producer's hand-off warp waits (named barrier 1 is the consumers' operands').
  static constexpr int kDqOrderBarrier = 2;
  // Dropout keep words per stage where they fit (192 and 192 / 128): one per thread of one
  // consumer, its key group's (draw_query_tile_keep_words); none at 256.
  static constexpr bool kTakesDropout = flash_backward_wide_takes_dropout(kHeadDimQK, kHeadDimV);
  static constexpr int kKeepWords = kTakesDropout ? kBlockN / 16 * 32 : 0;
  // K and V, kStages of Q and dO and of the rows' LSE and D, two buffers each of P^T and dU^T,
  // kStages of keep words, barriers, 1 KB of alignment.
  static constexpr int kSharedBytes = 2 * (kBlockN + kStages * kBlockM) * (kHeadDimQK + kHeadDimV) +
                                      kStages * 2 * kBlockM * 4 + 4 * kOperandTileBytes +
                                      kStages * kKeepWords * 4 + kBarrierBytes + 1024;
  static_assert(flash_backward_one_kernel_wide_eligible(kHeadDimQK, kHeadDimV),
                "head dims 256, 192 or 192 / 128");
  static_assert(kHeadDimQK % 64 == 0 && kHeadDimV % 64 == 0,
                "a consumer's columns are whole 64-column swizzle blocks");
  static_assert(kSplit.qk_blocks > 0 && kSplit.qk_blocks < kHeadDimQK / 64,
                "each consumer keeps some of dk's columns (and of dq's)");
  static_assert(kBlockM * 2 == 128, "P^T and dU^T rows are one 128-byte swizzle block");
  // full and empty per stage, K and V's, and deterministic mode's dq_ready per stage.
  static_assert(3 * kStages + 1 <= kBarrierBytes / 8, "mbarriers fit their slot");
  static_assert(kSharedBytes <= 227 * 1024, "tiles must fit sm_90 shared memory");
  static_assert(kSharedBytes == flash_backward_one_kernel_shared_bytes(kHeadDimQK, kHeadDimV,
                                                                       kTakesDropout, kBlockM),
                "flash_tiles.h's size (the selector's rule) matches this layout");
  static_assert(!kTakesDropout || kKeepWords == kConsumerThreads / 2,
                "one keep word per thread of a consumer: both read their key group's words");
  static_assert(2 * kBlockM == 128, "every producer thread arrives after its keep-word stores");
};

// Shared-memory addresses of a wide one-kernel backward block.
template <typename Traits>
struct OneKernelWideBackwardLayout {
  static constexpr int kBlockN = Traits::kBlockN, kBlockM = Traits::kBlockM;
  static constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  static constexpr int kStages = Traits::kStages;
  uint32_t k, v, stages, operands, barriers;
  float *lse, *delta;  // kStages x kBlockM each
  uint32_t* keep;      // kStages x Traits::kKeepWords

  __device__ explicit OneKernelWideBackwardLayout(unsigned char* storage) {
    const uint32_t base = (ptx::shared_address(storage) + 1023u) & ~1023u;
    k = base;
    v = k + kBlockN * kDimQK * 2;
    stages = v + kBlockN * kDimV * 2;
    operands = stages + kStages * kBlockM * (kDimQK + kDimV) * 2;
    const uint32_t statistics = operands + 4 * Traits::kOperandTileBytes;
    lse = reinterpret_cast<float*>(storage + (statistics - ptx::shared_address(storage)));
    delta = lse + kStages * kBlockM;
    keep = reinterpret_cast<uint32_t*>(delta + kStages * kBlockM);
    barriers = statistics + kStages * 2 * kBlockM * 4 + kStages * Traits::kKeepWords * 4;
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
  // Deterministic mode: the stage's query tile may be added to dq (its flag names this block).
  __device__ uint32_t dq_ready(int stage) const {
    return barriers + 8u * (2 * kStages + 1 + stage);
  }
};

// Deterministic mode's hand-off, run by the producer warpgroup's warp 3 (warp 0's thread 0
// issues the TMA copies and warps 0 and 1 draw the dropout keep bits, which should not wait for
// it; with warp 1, dropout's draws waited and the form ran 0.86x, session 34), an iteration
// behind the copies. For iteration j: its first lane waits until the tile's flag names this key
// block (when the previous key block adds to the tile too) and arrives on dq_ready; the warp then
// waits at the named barrier the consumers arrive at once their reductions are issued, and the lane
// hands the tile on with a releasing store. So neither the flag's load nor the release's wait for
// the reductions to land is on the consumers' path: they wait only where the previous key block
// has not yet handed the tile on.
template <typename Traits>
__device__ __forceinline__ void hand_over_dq_tile(const FlashBackwardParams& bp, const KeyBlock& kb,
                                                  const OneKernelWideBackwardLayout<Traits>& l,
                                                  int j) {
  const FlashForwardParams& p = bp.fwd;
  // The query tiles the previous key block adds to (empty for the first), computed here rather
  // than held: the producer's 40 registers also hold the dropout draws' context.
  const QueryTileSpan previous =
      key_block_query_tiles(kb.j0 - Traits::kBlockN, Traits::kBlockN, Traits::kBlockM, kb.seqlen_q,
                            kb.seqlen_kv, kb.diagonal, p.window_left, p.window_right);
  const int key_block = kb.j0 / Traits::kBlockN, tile = kb.first_query(j) / Traits::kBlockM;
  int* order =
      bp.dq_order + (int64_t(kb.batch) * p.heads_q + kb.head(j)) * bp.dq_tiles_per_head + tile;
  const bool first_lane = threadIdx.x % 32 == 0;
  if (first_lane) {
    if (previous.first <= tile && tile <= previous.last)
      while (ptx::load_acquire_gpu(order) != key_block) {
      }
    ptx::mbarrier_arrive(l.dq_ready(j % Traits::kStages));
  }
  __syncwarp();
  ptx::named_barrier_sync(Traits::kDqOrderBarrier, Traits::kConsumerThreads + 32);
  if (first_lane) ptx::store_release_gpu(order, key_block + 1);
}

// Adds a warp's dq fragments (iteration it's 64 query rows; `row` the thread's first, columns
// [column0, column0 + kN)) to the fp32 workspace of rows of kDimQK: one 8-byte reduction per row
// and n8 tile, so a warp's reduction fills whole 32-byte sectors (8 rows x 32 bytes), as a
// 16-byte one after a quad's lanes trade pairs would, without the shuffles and selects. A tile
// inside the sequence takes one uniform branch; only the last tile's reductions are tested (a
// test per reduction costs ptxas a branch and a BSSY / BSYNC pair each, predicated or not).
template <int kDimQK, int kN>
__device__ __forceinline__ void add_dq_fragments(const FlashBackwardParams& bp, const KeyBlock& kb,
                                                 int it, const float (&dq_tile)[kN / 8][4], int row,
                                                 int quad_col, int column0) {
  constexpr int kTileRows = kOneKernelBackwardBlockM;  // the query tile (the traits assert it)
  const int i0 = kb.first_query(it), i = i0 + row;
  const bool inside[2] = {i < kb.seqlen_q, i + 8 < kb.seqlen_q};
  float* accum = bp.dq_accum +
                 dq_workspace_row(bp.fwd, kb.batch, kb.head(it), inside[0] ? i : i0) * kDimQK +
                 column0 + 2 * quad_col;
  auto add = [&](float* address, int t, int half) {
    ptx::red_add_v2(address + half * 8 * kDimQK + 8 * t,
                    make_float2(dq_tile[t][2 * half], dq_tile[t][2 * half + 1]));
  };
  if (i0 + kTileRows <= kb.seqlen_q) {
#pragma unroll
    for (int t = 0; t < kN / 8; ++t)
#pragma unroll
      for (int half = 0; half < 2; ++half) add(accum, t, half);
  } else {
#pragma unroll
    for (int t = 0; t < kN / 8; ++t)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        if (inside[half]) add(accum, t, half);
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

// A consumer of a wide block: its 32 query columns of every tile's S^T and dP^T, and kQkColumns
// columns of dk (and of each dq tile) from qk_column0 and kVColumns of dv from v_column0 (none:
// kVColumns 0), all whole 64-column blocks. Runs its whole key block, then stores dk and dv.
// kDeterministic: each dq tile is added in key-block order (the kernel's comment). kDropout: the
// keep bits of its query columns, from its key group's words (bits 16 consumer + 4 t + e), drop
// P^T's elements and dU^T's dP^T terms; dv is scaled by 1 / keep_prob at the end.
template <typename Traits, int kQkColumns, int kVColumns, bool kDeterministic, bool kDropout>
__device__ __forceinline__ void consume_wide_key_block(const FlashBackwardParams& bp,
                                                       const KeyBlock& kb,
                                                       const OneKernelWideBackwardLayout<Traits>& l,
                                                       int consumer, int qk_column0,
                                                       int v_column0) {
  using Element = typename Traits::Element;
  const FlashForwardParams& p = bp.fwd;
  constexpr int kBlockN = Traits::kBlockN, kBlockM = Traits::kBlockM;
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  constexpr int kStages = Traits::kStages, kConsumerThreads = Traits::kConsumerThreads;
  constexpr int kQueryColumns = Traits::kQueryColumns;
  constexpr int kMTiles = kQueryColumns / 8;
  static_assert(kQkColumns % 64 == 0 && kVColumns % 64 == 0, "whole 64-column blocks");
  constexpr int kVTiles = kVColumns > 0 ? kVColumns / 8 : 1;  // a placeholder tile when none

  const int warp_in_group = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int key_row = warp_in_group * 16 + quad_row;  // in the block (both consumers)
  const int key0 = kb.j0 + key_row;
  const int query_column0 = consumer * kQueryColumns;  // this consumer's S^T columns
  // An uneven split (192, 192 / 128) runs each consumer in its own instantiation of this body,
  // so the two reach their barriers at different instructions: those take the unaligned form
  // (synccheck, session 31). The even split (256) keeps one body and `bar.sync`.
  constexpr bool kEvenSplit = 2 * kQkColumns == kDimQK;
  auto consumers_sync = [](int id) {
    if constexpr (kEvenSplit)
      ptx::named_barrier_sync(id, kConsumerThreads);
    else
      ptx::named_barrier_sync_unaligned(id, kConsumerThreads);
  };
  // Deterministic mode: the tile's reductions are issued (the producer's hand-off warp waits).
  auto arrive_dq_added = [] {
    constexpr int kThreads = kConsumerThreads + 32;
    if constexpr (kEvenSplit)
      ptx::named_barrier_arrive(Traits::kDqOrderBarrier, kThreads);
    else
      ptx::named_barrier_arrive_unaligned(Traits::kDqOrderBarrier, kThreads);
  };
  // Its columns of a tile of 64 rows: whole 64-column blocks of 64 x 128 bytes.
  const uint32_t qk_offset = uint32_t(qk_column0 / 64) * 64 * 128;
  const uint32_t v_offset = uint32_t(v_column0 / 64) * 64 * 128;

  float dk_acc[kQkColumns / 8][4], dv_acc[kVTiles][4];
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
      // This thread's keep bits: its key group's word (warp in group x 32 + lane), shifted to
      // this consumer's query tiles.
      const uint32_t keep =
          kDropout
              ? l.keep[stage * Traits::kKeepWords + warp_in_group * 32 + lane] >> (16 * consumer)
              : 0u;
      key_tile_gradients<kDropout>(p, s, dp, derivative, quad_col,
                                   l.delta + stage * kBlockM + query_column0, keep,
                                   kDropout ? p.dropout_scale : 1.f);
      {
        uint32_t operand[kQueryColumns / 16][4];
        pack_operands<Element>(s, operand);
        store_key_major_operands(l.pt(buffer), operand, key_row - quad_row, query_column0 / 8);
        pack_operands<Element>(dp, operand);
        store_key_major_operands(l.dut(buffer), operand, key_row - quad_row, query_column0 / 8);
      }
      // Both consumers' columns are written (and, two iterations back, were last read: each
      // consumer waits for its products before the next iteration's barrier).
      ptx::fence_proxy_async_shared();
      consumers_sync(1);

      // dv += P^T dO over this consumer's columns, dq_tile = dU K, then dk += dU^T Q, so that dk
      // runs while dq is added.
      ptx::fence_accumulators(dk_acc);
      if constexpr (kVColumns > 0) ptx::fence_accumulators(dv_acc);
      ptx::wgmma_fence();
      if constexpr (kVColumns > 0)
        wgmma_keys_by_queries<Element, kVColumns>(dv_acc, l.pt(buffer), l.d_o(stage) + v_offset);
      float dq_tile[kQkColumns / 8][4];
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk)
        ptx::wgmma_ss_mn_major<Element, kQkColumns>(
            dq_tile, mn_major_descriptor(l.dut(buffer), kBlockN, kk),
            mn_major_descriptor(l.k + qk_offset, kBlockN, kk), kk > 0);
      ptx::wgmma_commit();
      wgmma_keys_by_queries<Element, kQkColumns>(dk_acc, l.dut(buffer), l.q(stage) + qk_offset);
      ptx::wgmma_commit();
      ptx::wgmma_wait<1>();  // dv and dq are done; dk may still run
      if constexpr (kVColumns > 0) ptx::fence_accumulators(dv_acc);
      ptx::fence_accumulators(dq_tile);
      // Deterministic mode: the previous key block has handed this tile on (hand_over_dq_tile).
      if constexpr (kDeterministic) ptx::mbarrier_wait(l.dq_ready(stage), (it / kStages) & 1);
      add_dq_fragments<kDimQK, kQkColumns>(bp, kb, it, dq_tile, warp_in_group * 16 + quad_row,
                                           quad_col, qk_column0);
      if constexpr (kDeterministic) arrive_dq_added();
      ptx::wgmma_wait<0>();
      ptx::fence_accumulators(dk_acc);
      ptx::mbarrier_arrive(l.empty(stage));  // Q, dO, LSE, D of this iteration are read
    }
  }

  if constexpr (kDropout && kVColumns > 0) {  // dv = Pd^T dO, Pd = P keep / keep_prob
#pragma unroll
    for (int t = 0; t < kVTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) dv_acc[t][e] *= p.dropout_scale;
  }
  store_key_rows<Element, kQkColumns>(kb, dk_acc, bp.scale, key0, quad_col,
                                      static_cast<Element*>(bp.dk) + qk_column0, bp.dk_batch_stride,
                                      bp.dk_row_stride, bp.dk_head_stride);
  if constexpr (kVColumns > 0)
    store_key_rows<Element, kVColumns>(kb, dv_acc, 1.f, key0, quad_col,
                                       static_cast<Element*>(bp.dv) + v_column0, bp.dv_batch_stride,
                                       bp.dv_row_stride, bp.dv_head_stride);
}

// kDeterministic: dq reductions in key-block order, the grid in key-block chains (bp.dq_order,
// bp.key_chain), as the narrow form's. kDropout (Traits::kTakesDropout: 192 and 192 / 128): the
// producer draws each query tile's keep bits into the stage as the narrow form's does.
template <typename Traits, bool kDeterministic, bool kDropout>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_backward_one_kernel_wide_sm90_kernel(const __grid_constant__ FlashBackwardParams bp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  constexpr int kQkFirst = Traits::kSplit.qk_blocks * 64, kVFirst = Traits::kSplit.v_blocks * 64;
  extern __shared__ __align__(1024) unsigned char shared_storage[];
  const OneKernelWideBackwardLayout<Traits> l(shared_storage);

  KeyBlock kb;
  if constexpr (kDeterministic) {
    const KeyBlockCoordinates c =
        deterministic_key_block(int(blockIdx.x), int(blockIdx.z), bp.fwd.batch, bp.key_chain);
    if (!make_key_block(bp.fwd, Traits::kBlockN, Traits::kBlockM, kb, c.batch, int(blockIdx.y),
                        c.key_block))
      return;
    // Last tile first, as the narrow form walks (its kernel says why).
    kb.descending = true;
  } else if (!make_key_block(bp.fwd, Traits::kBlockN, Traits::kBlockM, kb)) {
    return;
  }
  init_key_block_barriers<Traits>(l, query_tile_full_arrivals<Traits::kBlockM>(bp));
  if (kDeterministic && threadIdx.x == 0)
    for (int s = 0; s < Traits::kStages; ++s) ptx::mbarrier_init(l.dq_ready(s), 1);
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    ptx::setmaxnreg_decrease<40>();
    if (kb.iterations == 0) return;
    produce_key_block_operands<Traits>(bp, kb, l);
    // Deterministic mode: warp 3 hands each dq tile on an iteration behind the copies, and the
    // last one after them.
    const bool hands_over = kDeterministic && threadIdx.x / 32 == 3;
    auto after_copies = [&](int it) {
      if (hands_over && it > 0) hand_over_dq_tile<Traits>(bp, kb, l, it - 1);
    };
    // Deterministic mode loads the rows' statistics in their own iteration, as the narrow form's
    // producer does: a load in flight delays the hand-off's releasing store.
    if constexpr (kDropout) {
      static_assert(Traits::kTakesDropout, "keep words fit this layout");
      produce_key_block_iterations<Traits, !kDeterministic>(
          bp, kb, l,
          [&](int it, int stage) {
            draw_query_tile_keep_words<Traits::kBlockN, 1>(bp.fwd, kb, it,
                                                           l.keep + stage * Traits::kKeepWords);
          },
          after_copies);
    } else {
      produce_key_block_iterations<Traits, !kDeterministic>(
          bp, kb, l, [](int, int) {}, after_copies);
    }
    if (hands_over) hand_over_dq_tile<Traits>(bp, kb, l, kb.iterations - 1);
    return;
  }

  ptx::setmaxnreg_increase<232>();
  const int consumer = warpgroup - 1;
  if constexpr (2 * kQkFirst == kDimQK && 2 * kVFirst == kDimV) {
    // An even split (256): one body, the columns by consumer.
    consume_wide_key_block<Traits, kQkFirst, kVFirst, kDeterministic, kDropout>(
        bp, kb, l, consumer, consumer * kQkFirst, consumer * kVFirst);
  } else if (consumer == 0) {
    consume_wide_key_block<Traits, kQkFirst, kVFirst, kDeterministic, kDropout>(bp, kb, l, 0, 0, 0);
  } else {
    consume_wide_key_block<Traits, kDimQK - kQkFirst, kDimV - kVFirst, kDeterministic, kDropout>(
        bp, kb, l, 1, kQkFirst, kVFirst);
  }
#else
  (void)bp;  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace dpa::cuda
