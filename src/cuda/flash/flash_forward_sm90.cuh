// The wgmma flash forward kernel family (sm_90a, Hopper): the same algorithm and features as
// the mma.sync family (flash_forward_kernel.cuh, shared per-tile math in flash_tile_math.cuh)
// on warpgroup MMAs, which read Q, K and V straight from shared memory.
//
// A block owns 64 query rows per warpgroup (two warpgroups in the library's tiles). S = Q K^T is
// one wgmma chain per warpgroup (both operands K-major in shared memory); O += P V takes P from
// registers (the S accumulators rounded in place) and V as an MN-major operand. Shared tiles use
// the 128-byte swizzle (ptx/wgmma.cuh), written by cp.async at the swizzled addresses.
//
// Software pipeline (FlashAttention-3's intra-warpgroup overlap): iteration n issues
// S(n) = Q K(n)^T and O += P(n-1) V(n-1) back to back, waits for S(n) only, and runs the
// softmax of tile n on the special-function and FMA pipes while the tensor cores still work on
// P(n-1) V(n-1); O is rescaled once that MMA has landed. K and V have two shared stages each,
// V one tile behind K: the top of iteration n copies in K(n+1) and V(n), which overwrite K(n-1)
// and V(n-2), both finished before the barrier there. One barrier per tile.
#pragma once

#include <type_traits>

#include "cuda/flash/flash_forward_sm90_descriptors.cuh"
#include "cuda/flash/flash_tile_math.cuh"
#include "cuda/flash/flash_tiles.h"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace dpa::cuda {

// kWarpgroupsT and kBlockNT default to flash_forward_wgmma_tile_shape's choice (what the
// library runs); dev benches instantiate others to compare.
template <typename ElementT, int kHeadDimQKT, int kHeadDimVT,
          int kWarpgroupsT = flash_forward_wgmma_tile_shape(kHeadDimQKT, kHeadDimVT).warps / 4,
          int kBlockNT = flash_forward_wgmma_tile_shape(kHeadDimQKT, kHeadDimVT).block_n>
struct FlashSm90Traits {
  using Element = ElementT;
  static constexpr int kHeadDimQK = kHeadDimQKT, kHeadDimV = kHeadDimVT;
  static constexpr int kWarpgroups = kWarpgroupsT;
  static constexpr int kBlockM = 64 * kWarpgroups, kBlockN = kBlockNT;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kStages = 2;
  static constexpr int kQBytes = kBlockM * kHeadDimQK * 2;
  static constexpr int kKBytes = kBlockN * kHeadDimQK * 2;
  static constexpr int kVBytes = kBlockN * kHeadDimV * 2;
  // Q, two stages of K and V, and 1 KB to align the base to the swizzle pattern.
  static constexpr int kSharedBytes = kQBytes + kStages * (kKBytes + kVBytes) + 1024;
  static_assert(sizeof(Element) == 2, "16-bit elements");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "PV consumes 16 keys per MMA");
  static_assert(kSharedBytes <= 227 * 1024, "tile does not fit sm_90 shared memory");
};

// Copies a kRows x kDim tile into 128-byte-swizzled shared memory (rows beyond `valid_rows`
// read as zeros). Consecutive threads copy consecutive 16-byte chunks of a row (coalesced).
template <typename Element, int kRows, int kDim, int kThreads>
__device__ __forceinline__ void load_swizzled_tile_async(uint32_t shared_tile,
                                                         const Element* global_tile,
                                                         int64_t row_stride, int valid_rows) {
  constexpr int kChunksPerRow = kDim / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  constexpr int kPerThread = (kChunks + kThreads - 1) / kThreads;
  constexpr bool kEven = kChunks % kThreads == 0;  // else the last round is partial
  // A whole tile in range (the common case) skips the per-chunk bounds test and select.
  auto copy = [&](auto whole_tile) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int chunk = int(threadIdx.x) + i * kThreads;
      if (!kEven && chunk >= kChunks) break;
      const int row = chunk / kChunksPerRow;
      const int column = (chunk % kChunksPerRow) * 8;
      const bool valid = decltype(whole_tile)::value || row < valid_rows;
      const Element* source = valid ? global_tile + row * row_stride + column : global_tile;
      ptx::cp_async_16(shared_tile + ptx::swizzled_offset(kRows, row, column), source, valid);
    }
  };
  if (valid_rows >= kRows)
    copy(std::true_type{});
  else
    copy(std::false_type{});
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

  // Broadcast from lane 0 so the compiler knows it is warp-uniform (ForwardDescriptors).
  const int warpgroup = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
  const int warp_in_group = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  // This thread's row g (the slab's half 0) in the sequence.
  const int row0 = b.m0 + warpgroup * 64 + warp_in_group * 16 + quad_row;

  const float sink_log2 = block_sink_log2(p, b.head);
  const SoftmaxShift shift = block_softmax_shift<Element>(p, sink_log2);
  RowStats stats = initial_row_stats(sink_log2, quad_col, shift);
  float o_acc[kVTiles][4];
#pragma unroll
  for (int t = 0; t < kVTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_acc[t][e] = 0.f;

  auto load_k = [&](int n_block, int stage) {
    const int n0 = n_block * kBlockN;
    load_swizzled_tile_async<Element, kBlockN, kDimQK, kThreads>(
        k_shared(stage), b.k + int64_t(n0) * p.k_row_stride, p.k_row_stride, b.seqlen_kv - n0);
  };
  auto load_v = [&](int n_block, int stage) {
    const int n0 = n_block * kBlockN;
    load_swizzled_tile_async<Element, kBlockN, kDimV, kThreads>(
        v_shared(stage), b.v + int64_t(n0) * p.v_row_stride, p.v_row_stride, b.seqlen_kv - n0);
  };

  // Q and the first K tile. Stages are indexed by tile parity (n_block % 2).
  load_swizzled_tile_async<Element, kBlockM, kDimQK, kThreads>(q_shared, b.q, p.q_row_stride,
                                                               b.rows_here);
  if (b.n_block_begin < b.n_block_end) load_k(b.n_block_begin, b.n_block_begin % 2);
  ptx::cp_async_commit();

  const ForwardDescriptors<Traits> descriptors(q_shared + warpgroup * 64 * 128, k_shared(0),
                                               v_shared(0));

  // Tile n_block's logits, mask, softmax update and dropout: S becomes P (fp32, in place) and
  // `correction` the factor that rescales O to the new row max.
  float correction[2];
  auto logits_to_probabilities = [&](float(&s_acc)[kNTiles][4], int n_block,
                                     const uint32_t(&keep)[2]) {
    const int n0 = n_block * kBlockN;
    const bool fully_visible = n0 >= b.last_row.begin && n0 + kBlockN <= b.first_row.end;
    transform_logits<Element, kNTiles>(p, b, s_acc, row0, n0, quad_col, fully_visible, shift.shift,
                                       shift.scale_in_exp2);
    softmax_update(s_acc, stats, correction, shift);
    if (p.dropout_threshold != 0) apply_dropout(p, s_acc, keep);
  };
  // P rounded to Element: the A operand of the next O += P V.
  uint32_t p_operand[kBlockN / 16][4];
  auto pack_probabilities = [&](const float(&s_acc)[kNTiles][4]) {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) pack_p_operand<Element>(s_acc, kk, p_operand[kk]);
  };
  auto issue_qk = [&](float(&s_acc)[kNTiles][4], int stage) {
#pragma unroll
    for (int kk = 0; kk < kDimQK / 16; ++kk)
      ptx::wgmma_ss<Element, kBlockN>(s_acc, descriptors.q_at(kk), descriptors.k_at(stage, kk),
                                      kk > 0);
    ptx::wgmma_commit();
  };
  auto issue_pv = [&](int stage) {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      ptx::wgmma_rs<Element, kDimV>(o_acc, p_operand[kk], descriptors.v_at(stage, kk), true);
    ptx::wgmma_commit();
  };
  auto draw_keep = [&](int n_block, uint32_t(&keep)[2]) {
    keep[0] = keep[1] = 0;
    if (p.dropout_threshold != 0)
      draw_keep_bits<kNTiles>(p, b, row0, n_block * kBlockN, quad_col, keep);
  };
  // Waits for this thread's copies, publishes them to the async proxy and the block.
  auto tiles_landed = [&] {
    ptx::cp_async_wait<0>();
    ptx::fence_proxy_async_shared();
    __syncthreads();
  };

  if (b.n_block_begin < b.n_block_end) {
    // Prologue: S and P of the first tile (nothing to overlap with yet).
    const int first = b.n_block_begin;
    tiles_landed();  // Q and K(first)
    load_v(first, first % 2);
    if (first + 1 < b.n_block_end) load_k(first + 1, (first + 1) % 2);
    ptx::cp_async_commit();
    uint32_t keep[2];
    draw_keep(first, keep);
    float s_acc[kNTiles][4];
    ptx::wgmma_fence();
    issue_qk(s_acc, first % 2);
    ptx::wgmma_wait<0>();
    ptx::fence_accumulators(s_acc);
    logits_to_probabilities(s_acc, first, keep);  // O is still zero: no rescale
    pack_probabilities(s_acc);

    for (int n_block = first + 1; n_block < b.n_block_end; ++n_block) {
      const int stage = n_block % 2;
      // K(n) and V(n-1) landed; every warpgroup is done with tile n-1's MMAs, so K(n-1)'s and
      // V(n-2)'s stages are free.
      tiles_landed();
      load_v(n_block, stage);
      if (n_block + 1 < b.n_block_end) load_k(n_block + 1, stage ^ 1);
      ptx::cp_async_commit();
      draw_keep(n_block, keep);

      ptx::fence_accumulators(o_acc);
      ptx::wgmma_fence();
      issue_qk(s_acc, stage);
      issue_pv(stage ^ 1);   // P(n-1) V(n-1)
      ptx::wgmma_wait<1>();  // S(n) is ready; P(n-1) V(n-1) may still run
      ptx::fence_accumulators(s_acc);
      // The MMA in flight still reads p_operand and o_acc: S stays in its own registers until
      // it lands, then O is rescaled and P overwritten.
      logits_to_probabilities(s_acc, n_block, keep);
      ptx::wgmma_wait<0>();
      ptx::fence_accumulators(o_acc);
      ptx::fence_registers(p_operand);
      if (!shift.fixed) rescale_rows_if_moved(o_acc, correction);
      pack_probabilities(s_acc);
    }

    // Epilogue of the pipeline: O += P(last) V(last).
    tiles_landed();
    ptx::fence_accumulators(o_acc);
    ptx::wgmma_fence();
    issue_pv((b.n_block_end - 1) % 2);
    ptx::wgmma_wait<0>();
    ptx::fence_accumulators(o_acc);
  } else {
    ptx::cp_async_wait<0>();  // no visible keys: only Q was copied
  }

  store_slab(p, b, o_acc, stats, row0, quad_col);
#else
  (void)p;  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace dpa::cuda
