// The wgmma flash forward kernel family (sm_90a, Hopper): the same algorithm and features as
// the mma.sync family (flash_forward_kernel.cuh, shared per-tile math in flash_tile_math.cuh)
// on warpgroup MMAs, which read Q, K and V straight from shared memory.
//
// A block owns 128 query rows: two warpgroups of 64 rows. S = Q K^T is one wgmma chain per
// warpgroup (both operands K-major in shared memory); O += P V takes P from registers (the S
// accumulators rounded in place) and V as an MN-major operand. K and V tiles are double-
// buffered: tile n+1 is copied in with cp.async while the block computes on tile n, so each
// tile costs one barrier. Shared tiles use the 128-byte swizzle (ptx/wgmma.cuh), written by
// cp.async at the swizzled addresses.
#pragma once

#include "cuda/flash/flash_tile_math.cuh"
#include "cuda/flash/flash_tiles.h"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace dpa::cuda {

template <typename ElementT, int kHeadDimQKT, int kHeadDimVT>
struct FlashSm90Traits {
  using Element = ElementT;
  static constexpr FlashTileShape kShape = flash_forward_wgmma_tile_shape(kHeadDimQKT, kHeadDimVT);
  static constexpr int kHeadDimQK = kHeadDimQKT, kHeadDimV = kHeadDimVT;
  static constexpr int kBlockM = kShape.block_m, kBlockN = kShape.block_n;
  static constexpr int kThreads = 32 * kShape.warps;
  static constexpr int kStages = 2;
  static constexpr int kQBytes = kBlockM * kHeadDimQK * 2;
  static constexpr int kKBytes = kBlockN * kHeadDimQK * 2;
  static constexpr int kVBytes = kBlockN * kHeadDimV * 2;
  static constexpr int kSharedBytes = kShape.shared_bytes;
  static_assert(sizeof(Element) == 2, "16-bit elements");
  static_assert(kBlockM == 128 && kThreads == 256, "two warpgroups of 64 rows");
  static_assert(kQBytes + kStages * (kKBytes + kVBytes) + 1024 <= kSharedBytes, "shared layout");
};

// Copies a kRows x kDim tile into 128-byte-swizzled shared memory (rows beyond `valid_rows`
// read as zeros). Consecutive threads copy consecutive 16-byte chunks of a row (coalesced).
template <typename Element, int kRows, int kDim, int kThreads>
__device__ __forceinline__ void load_swizzled_tile_async(uint32_t shared_tile,
                                                         const Element* global_tile,
                                                         int64_t row_stride, int valid_rows) {
  constexpr int kChunksPerRow = kDim / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int chunk = int(threadIdx.x) + i * kThreads;
    const int row = chunk / kChunksPerRow;
    const int column = (chunk % kChunksPerRow) * 8;
    const bool valid = row < valid_rows;
    const Element* source = valid ? global_tile + row * row_stride + column : global_tile;
    ptx::cp_async_16(shared_tile + ptx::swizzled_offset(kRows, row, column), source, valid);
  }
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_forward_sm90_kernel(const __grid_constant__ FlashForwardParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  constexpr int kThreads = Traits::kThreads;
  constexpr int kNTiles = kBlockN / 8;  // n8 tiles of S per thread
  constexpr int kVTiles = kDimV / 8;    // n8 tiles of O per thread

  extern __shared__ __align__(1024) unsigned char shared_storage[];
  // The swizzle pattern repeats every 1024 bytes and wgmma assumes tiles start on it.
  const uint32_t shared_base = (ptx::shared_address(shared_storage) + 1023u) & ~1023u;
  const uint32_t q_shared = shared_base;
  auto k_shared = [&](int stage) {
    return shared_base + Traits::kQBytes + uint32_t(stage) * Traits::kKBytes;
  };
  auto v_shared = [&](int stage) {
    return shared_base + Traits::kQBytes + Traits::kStages * Traits::kKBytes +
           uint32_t(stage) * Traits::kVBytes;
  };

  FlashBlock<Element> b;
  if (!make_flash_block(p, kBlockM, kBlockN, b)) return;

  const int warpgroup = threadIdx.x / 128;
  const int warp_in_group = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  // This thread's row g (the slab's half 0) in the sequence.
  const int row0 = b.m0 + warpgroup * 64 + warp_in_group * 16 + quad_row;

  RowStats stats = initial_row_stats(block_sink_log2(p, b.head), quad_col);
  float o_acc[kVTiles][4];
#pragma unroll
  for (int t = 0; t < kVTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_acc[t][e] = 0.f;

  auto load_kv = [&](int n_block, int stage) {
    const int n0 = n_block * kBlockN;
    load_swizzled_tile_async<Element, kBlockN, kDimQK, kThreads>(
        k_shared(stage), b.k + int64_t(n0) * p.k_row_stride, p.k_row_stride, b.seqlen_kv - n0);
    load_swizzled_tile_async<Element, kBlockN, kDimV, kThreads>(
        v_shared(stage), b.v + int64_t(n0) * p.v_row_stride, p.v_row_stride, b.seqlen_kv - n0);
  };

  // Prologue: Q and the first K/V tile in one group.
  load_swizzled_tile_async<Element, kBlockM, kDimQK, kThreads>(q_shared, b.q, p.q_row_stride,
                                                               b.rows_here);
  if (b.n_block_begin < b.n_block_end) load_kv(b.n_block_begin, 0);
  ptx::cp_async_commit();

  // K-major descriptors advance 32 bytes per 16 columns inside a 64-column block and one
  // block (rows x 128 bytes) per 64 columns; V (MN-major) advances 16 rows per k-step.
  auto q_descriptor = [&](int kk) {
    const uint32_t address = q_shared + (kk / 4) * (kBlockM * 128) + warpgroup * 64 * 128 +
                             (kk % 4) * 32;
    return ptx::smem_descriptor(address, 16, 1024);
  };
  auto k_descriptor = [&](int stage, int kk) {
    const uint32_t address = k_shared(stage) + (kk / 4) * (kBlockN * 128) + (kk % 4) * 32;
    return ptx::smem_descriptor(address, 16, 1024);
  };
  auto v_descriptor = [&](int stage, int kk) {
    return ptx::smem_descriptor(v_shared(stage) + kk * 16 * 128, kBlockN * 128, 1024);
  };

  int stage = 0;
  for (int n_block = b.n_block_begin; n_block < b.n_block_end; ++n_block, stage ^= 1) {
    const int n0 = n_block * kBlockN;
    ptx::cp_async_wait<0>();
    ptx::fence_proxy_async_shared();
    // Tile n landed for every thread, and every warpgroup's MMAs on tile n-1 are complete
    // (waited below), so the other stage is free for tile n+1.
    __syncthreads();
    if (n_block + 1 < b.n_block_end) load_kv(n_block + 1, stage ^ 1);
    ptx::cp_async_commit();

    uint32_t keep_bits[2] = {};
    if (p.dropout_threshold != 0)
      draw_keep_bits<kNTiles>(p, b.batch, b.head, row0, n0, quad_col, keep_bits);

    float s_acc[kNTiles][4];
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDimQK / 16; ++kk)
      ptx::wgmma_ss<Element, kBlockN>(s_acc, q_descriptor(kk), k_descriptor(stage, kk), kk > 0);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::fence_accumulators(s_acc);

    const bool fully_visible = n0 >= b.last_row.begin && n0 + kBlockN <= b.first_row.end;
    transform_logits(p, b, s_acc, row0, n0, quad_col, fully_visible);
    online_softmax(s_acc, o_acc, stats);
    if (p.dropout_threshold != 0) apply_dropout(p, s_acc, keep_bits);

    uint32_t p_operand[kBlockN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) pack_p_operand<Element>(s_acc, kk, p_operand[kk]);
    ptx::fence_accumulators(o_acc);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      ptx::wgmma_rs<Element, kDimV>(o_acc, p_operand[kk], v_descriptor(stage, kk), true);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::fence_accumulators(o_acc);
  }

  store_slab(p, b, o_acc, stats, row0, quad_col);
#else
  (void)p;  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace dpa::cuda
