// What the Hopper one-kernel backward (flash_backward_sm90_one_kernel.cuh and its wide form)
// builds on: wgmma operand descriptors of 128-byte-swizzled tiles, the S^T / dP^T and
// register-operand products, and the producer warpgroup's copies of a key block and of each
// query tile (TMA or cp.async into the tiles, the rows' LSE and D loaded an iteration ahead and
// stored plainly, all completing on the stage's `full` mbarrier). The per-tile math shared with the
// mma.sync pair is in flash_backward_kernel.cuh.
#pragma once

#include "cuda/flash/flash_backward_kernel.cuh"
#include "cuda/flash/flash_forward_sm90_ws.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace dpa::cuda {

// Descriptor of a K-major operand: rows `row0..` of a swizzled tile of `rows` rows, 16 columns
// from 16 * kk (64-column blocks of rows x 128 bytes). Built from the rows' start and advanced
// by the k-step's constant offset (ptx::advance_descriptor), so that the k-steps of one product
// share one descriptor build.
__device__ __forceinline__ uint64_t k_major_descriptor(uint32_t tile, int rows, int row0, int kk) {
  const uint64_t rows_start = ptx::smem_descriptor(tile + row0 * 128, 16, 1024);
  return ptx::advance_descriptor(rows_start, (kk / 4) * (rows * 128) + (kk % 4) * 32);
}

// Descriptor of an MN-major B operand: 16 rows from 16 * kk of a swizzled tile of `rows` rows
// (the K dimension runs along the rows, N along the columns).
__device__ __forceinline__ uint64_t mn_major_descriptor(uint32_t tile, int rows, int kk) {
  return ptx::advance_descriptor(ptx::smem_descriptor(tile, rows * 128, 1024), kk * 16 * 128);
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

// The block's K and V into their swizzled tiles; `kv_barrier` (128 arrivals) completes when
// both have landed. Run by the 128 producer threads.
template <typename Element, int kBlockN, int kDimQK, int kDimV>
__device__ __forceinline__ void produce_key_block(const FlashForwardParams& p, const KeyBlock& kb,
                                                  uint32_t k_shared, uint32_t v_shared,
                                                  uint32_t kv_barrier) {
  produce_swizzled_tile<Element, kBlockN, kDimQK>(
      k_shared, key_block_rows<Element>(kb, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride),
      p.k_row_stride, kb.keys_here);
  produce_swizzled_tile<Element, kBlockN, kDimV>(
      v_shared, key_block_rows<Element>(kb, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride),
      p.v_row_stride, kb.keys_here);
  ptx::cp_async_mbarrier_arrive_noinc(kv_barrier);
}

// The row statistics producer thread r stores for an iteration, as loaded: statistic
// r + kLoaders k for k < kPerThread, where statistic s < kBlockM is row s's LSE (row_lse_stored;
// produce_query_tile converts it) and s >= kBlockM row s - kBlockM's D. kLoaders: the producer
// threads that load them (all 128, or the first 64 where the producer splits: one each at
// 64-row tiles and 128 loaders, else two or more).
template <int kBlockM, int kLoaders = 128>
struct QueryTileRowStatistics {
  static constexpr int kPerThread = (2 * kBlockM + kLoaders - 1) / kLoaders;
  // The producer threads that store any (each arrives once on the stage's `full` barrier).
  static constexpr int kThreads = 2 * kBlockM < kLoaders ? 2 * kBlockM : kLoaders;
  float value[kPerThread];
};

// Iteration it's row statistics for this producer thread (QueryTileRowStatistics). Loaded an
// iteration ahead of their store (produce_key_block_iterations), so the loads' latency is off the
// producer's path; nothing here reads a loaded value, which a conversion beside the load did
// (ncu and SASS, session 25: the multiply right after the LDG).
template <int kBlockM, int kLoaders = 128>
__device__ __forceinline__ QueryTileRowStatistics<kBlockM, kLoaders> query_tile_row_statistics(
    const FlashBackwardParams& bp, const KeyBlock& kb, int it) {
  static_assert(2 * kBlockM <= 2 * 128, "the producer warpgroup stores each row's LSE and D");
  QueryTileRowStatistics<kBlockM, kLoaders> loaded;
  const int head = kb.head(it), i0 = kb.first_query(it);
#pragma unroll
  for (int k = 0; k < loaded.kPerThread; ++k) {
    const int s = int(threadIdx.x) + kLoaders * k, i = i0 + s % kBlockM;
    loaded.value[k] = s >= 2 * kBlockM ? 0.f
                      : s < kBlockM    ? row_lse_stored(bp.fwd, kb.batch, head, i, kb.seqlen_q)
                                       : row_delta_of(bp, kb.batch, head, i, kb.seqlen_q);
  }
  return loaded;
}

// The arrivals that complete a stage's `full` mbarrier (produce_query_tile): the copies' (one
// expect-tx arrival with TMA, else one cp.async arrival per producer thread) and one plain
// arrival per producer thread that stores row statistics.
template <int kBlockM, int kLoaders = 128>
__device__ __forceinline__ uint32_t query_tile_full_arrivals(const FlashBackwardParams& bp) {
  return (bp.tma_query_tiles ? 1u : 128u) +
         uint32_t(QueryTileRowStatistics<kBlockM, kLoaders>::kThreads);
}

// Iteration it's Q and dO rows and its rows' LSE (in log2 units) and D (`statistics`, as loaded
// by query_tile_row_statistics: plain stores by the first QueryTileRowStatistics::kThreads
// producer threads, each followed by a plain arrive), all completing on `full_barrier`
// (query_tile_full_arrivals). The rows are copied by TMA (bp.tma_query_tiles: thread 0 issues one
// box of kBlockM rows and 64 columns per tensor and block of columns; rows past the tensor land
// as zeros) or by all 128 producer threads with cp.async (rows past the sequence zero-filled:
// so fewer than 128 loaders only with TMA, one_kernel_producer_splits' condition).
// `extras` runs in every producer thread before the statistics' stores; what it stores is
// released with them by the threads that arrive.
template <typename Element, int kBlockM, int kDimQK, int kDimV, int kLoaders, typename Extras>
__device__ __forceinline__ void produce_query_tile(
    const FlashBackwardParams& bp, const KeyBlock& kb, int it, uint32_t q_shared,
    uint32_t do_shared, float* lse, float* delta,
    const QueryTileRowStatistics<kBlockM, kLoaders>& statistics, uint32_t full_barrier,
    Extras extras) {
  const FlashForwardParams& p = bp.fwd;
  const int i0 = kb.first_query(it);
  const int r = int(threadIdx.x);
  if (bp.tma_query_tiles) {
    if (r == 0) {
      const int head = kb.head(it);
      ptx::mbarrier_arrive_expect_tx(full_barrier, kBlockM * (kDimQK + kDimV) * 2);
#pragma unroll
      for (int c = 0; c < kDimQK / 64; ++c)
        ptx::tma_load_4d(q_shared + c * (kBlockM * 128), &bp.q_tile_map, 64 * c, i0, head, kb.batch,
                         full_barrier);
#pragma unroll
      for (int c = 0; c < kDimV / 64; ++c)
        ptx::tma_load_4d(do_shared + c * (kBlockM * 128), &bp.do_tile_map, 64 * c, i0, head,
                         kb.batch, full_barrier);
    }
  } else {
    produce_swizzled_tile<Element, kBlockM, kDimQK>(
        q_shared,
        query_tile_rows<Element>(kb, it, p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride),
        p.q_row_stride, kb.seqlen_q - i0);
    produce_swizzled_tile<Element, kBlockM, kDimV>(
        do_shared,
        query_tile_rows<Element>(kb, it, bp.d_o, bp.do_batch_stride, bp.do_row_stride,
                                 bp.do_head_stride),
        bp.do_row_stride, kb.seqlen_q - i0);
    ptx::cp_async_mbarrier_arrive_noinc(full_barrier);
  }
  extras();
  if (r < statistics.kThreads) {
#pragma unroll
    for (int k = 0; k < statistics.kPerThread; ++k) {
      const int s = r + kLoaders * k;
      if (s < kBlockM)
        lse[s] = lse_log2_of(statistics.value[k]);
      else if (s < 2 * kBlockM)
        delta[s - kBlockM] = statistics.value[k];
    }
    ptx::mbarrier_arrive(full_barrier);  // release: the stores above are visible
  }
}

}  // namespace dpa::cuda
