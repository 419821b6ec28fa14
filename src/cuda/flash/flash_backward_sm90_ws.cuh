// The warp-specialised forms of the wgmma backward kernels (flash_backward_sm90.cuh), with the
// schedule that took the forward from 0.80x to 1.04x of SDPA-flash (flash_forward_sm90_ws.cuh):
// a producer warpgroup fills stages with cp.async and arrives on each stage's `full` mbarrier
// through cp.async.mbarrier.arrive.noinc (it never waits for a copy); two consumer warpgroups
// take turns issuing their MMAs (named barriers 1 and 2), so one's elementwise phase runs under
// the other's MMAs; within a consumer, the register-operand products of tile n - 1 are issued
// together with the shared-operand products of tile n. setmaxnreg 40 / 232. Run on Hopper only
// when config.flash_backward_kernel asks for it (the one-kernel backward takes deterministic
// mode and dropout since session 14); 1.5x the mma.sync pair.
//
// - dq: the producer copies Q and dO once and K, V per 64-key tile; a consumer issues
//   S(n) = Q K(n)^T, dP(n) = dO V(n)^T and dq += dU(n-1) K(n-1), then releases stage n - 1.
// - dk/dv: the producer copies K and V once and, per (query head, 32-row query tile), Q, dO and
//   the rows' LSE and D (plain loads, transformed as row_lse_log2 does, stored with a plain
//   arrive); a consumer issues S^T(n), dP^T(n), dv += Pd^T(n-1) dO(n-1) and
//   dk += dU^T(n-1) Q(n-1).
#pragma once

#include "cuda/flash/flash_backward_sm90.cuh"
#include "cuda/flash/flash_forward_sm90_ws.cuh"
#include "cuda/ptx/mbarrier.cuh"

namespace dpa::cuda {

template <typename ElementT, int kHeadDimQKT, int kHeadDimVT>
struct FlashBackwardSm90WsTraits {
  using Element = ElementT;
  static constexpr int kHeadDimQK = kHeadDimQKT, kHeadDimV = kHeadDimVT;
  static constexpr int kThreads = 384;  // producer warpgroup + two consumers
  static constexpr int kConsumerThreads = 256;
  static constexpr int kStages = 3;
  static constexpr int kDqBlockM = 128, kDqBlockN = 64;
  static constexpr int kDkvBlockN = 128, kDkvBlockM = 32;
  static constexpr int kBarrierBytes = 64;  // full and empty per stage, one for the fixed tiles
  // Q and dO of the block, kStages of K and V, barriers, 1 KB of alignment.
  static constexpr int kDqSharedBytes =
      2 * (kDqBlockM + kStages * kDqBlockN) * (kHeadDimQK + kHeadDimV) + kBarrierBytes + 1024;
  // K and V of the block, kStages of Q and dO and of the rows' LSE and D, the 8 consumer
  // warps' keep masks, barriers, alignment.
  static constexpr int kDkvSharedBytes =
      2 * (kDkvBlockN + kStages * kDkvBlockM) * (kHeadDimQK + kHeadDimV) +
      kStages * 2 * kDkvBlockM * 4 + 8 * 2 * kDkvBlockM + kBarrierBytes + 1024;
  static_assert(flash_backward_wgmma_eligible(kHeadDimQK, kHeadDimV), "head dims 64 or 128");
  static_assert(kDkvBlockM == 32, "one query per lane for the keep masks (8 x 64 bytes)");
  static_assert(2 * kStages + 1 <= kBarrierBytes / 8, "mbarriers fit their slot");
  static_assert(kDqSharedBytes <= 227 * 1024 && kDkvSharedBytes <= 227 * 1024,
                "tiles must fit sm_90 shared memory");
  static_assert(flash_backward_max(kDqSharedBytes, kDkvSharedBytes) ==
                    flash_backward_wgmma_ws_shared_bytes(kHeadDimQK, kHeadDimV),
                "flash_tiles.h's size (the selector's rule) matches this layout");
};

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_backward_dq_sm90_ws_kernel(const __grid_constant__ FlashBackwardParams bp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  const FlashForwardParams& p = bp.fwd;
  constexpr int kBlockM = Traits::kDqBlockM, kBlockN = Traits::kDqBlockN;
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  constexpr int kStages = Traits::kStages, kConsumerThreads = Traits::kConsumerThreads;
  constexpr int kNTiles = kBlockN / 8;

  extern __shared__ __align__(1024) unsigned char shared_storage[];
  const uint32_t base = (ptx::shared_address(shared_storage) + 1023u) & ~1023u;
  const uint32_t q_shared = base;
  const uint32_t do_shared = q_shared + kBlockM * kDimQK * 2;
  const uint32_t stages = do_shared + kBlockM * kDimV * 2;
  auto k_shared = [&](int stage) { return stages + uint32_t(stage) * kBlockN * kDimQK * 2; };
  auto v_shared = [&](int stage) {
    return stages + kStages * kBlockN * kDimQK * 2 + uint32_t(stage) * kBlockN * kDimV * 2;
  };
  const uint32_t barriers = stages + kStages * kBlockN * (kDimQK + kDimV) * 2;
  auto full_barrier = [&](int stage) { return barriers + 8u * stage; };
  auto empty_barrier = [&](int stage) { return barriers + 8u * (kStages + stage); };
  const uint32_t q_barrier = barriers + 8u * (2 * kStages);

  FlashBlock<Element> b;
  if (!make_flash_block(p, kBlockM, kBlockN, b)) return;
  const int tiles = b.n_block_end - b.n_block_begin;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(full_barrier(s), 128);
      ptx::mbarrier_init(empty_barrier(s), kConsumerThreads);
    }
    ptx::mbarrier_init(q_barrier, 128);
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    // Producer: Q and dO once, then K and V of each tile into the next free stage.
    ptx::setmaxnreg_decrease<40>();
    if (tiles == 0) return;
    const Element* d_o = block_d_o(bp, b);
    produce_swizzled_tile<Element, kBlockM, kDimQK>(q_shared, b.q, p.q_row_stride, b.rows_here);
    produce_swizzled_tile<Element, kBlockM, kDimV>(do_shared, d_o, bp.do_row_stride, b.rows_here);
    ptx::cp_async_mbarrier_arrive_noinc(q_barrier);
#pragma unroll 1
    for (int it = 0; it < tiles; ++it) {
      const int stage = it % kStages;
      if (it >= kStages) ptx::mbarrier_wait(empty_barrier(stage), (it / kStages - 1) & 1);
      const int n0 = (b.n_block_begin + it) * kBlockN;
      produce_swizzled_tile<Element, kBlockN, kDimQK>(
          k_shared(stage), b.k + int64_t(n0) * p.k_row_stride, p.k_row_stride, b.seqlen_kv - n0);
      produce_swizzled_tile<Element, kBlockN, kDimV>(
          v_shared(stage), b.v + int64_t(n0) * p.v_row_stride, p.v_row_stride, b.seqlen_kv - n0);
      ptx::cp_async_mbarrier_arrive_noinc(full_barrier(stage));
    }
    ptx::cp_async_commit();  // leave no copy of this thread in flight at exit
    ptx::cp_async_wait<0>();
    return;
  }

  ptx::setmaxnreg_increase<232>();
  const int consumer = warpgroup - 1;
  const int warp_in_group = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int row0 = b.m0 + consumer * 64 + warp_in_group * 16 + quad_row;
  const int my_turn = 1 + consumer, their_turn = 2 - consumer;  // named barrier ids

  float dq_acc[kDimQK / 8][4];
  zero_fragments(dq_acc);
  if (tiles > 0) {
    float lse2[2], delta[2];
    load_row_statistics(bp, b, row0, lse2, delta);
    auto wait_landed = [&](uint32_t barrier, uint32_t parity) {
      ptx::mbarrier_wait(barrier, parity);
      ptx::fence_proxy_async_shared();
    };
    float s[kNTiles][4], dp[kNTiles][4], derivative[kNTiles][4];
    uint32_t du_operand[kBlockN / 16][4];
    // S(n) and dP(n), then (after their wait) P, dU into s.
    auto issue_s_dp = [&](int stage) {
      wgmma_rows_by_rows<Element, kBlockN, kDimQK>(s, q_shared, kBlockM, consumer * 64,
                                                   k_shared(stage));
      wgmma_rows_by_rows<Element, kBlockN, kDimV>(dp, do_shared, kBlockM, consumer * 64,
                                                  v_shared(stage));
      ptx::wgmma_commit();
    };
    auto issue_dq = [&](int stage) {
      wgmma_fragments_by_rows<Element, kDimQK, kBlockN>(dq_acc, du_operand, k_shared(stage));
      ptx::wgmma_commit();
    };
    auto logit_gradients = [&](int n_block, const uint32_t(&keep)[2]) {
      const int n0 = n_block * kBlockN;
      const bool fully_visible = n0 >= b.last_row.begin && n0 + kBlockN <= b.first_row.end;
      query_tile_probabilities(p, b, s, derivative, row0, n0, quad_col, lse2, fully_visible);
      query_tile_logit_gradients(p, s, dp, derivative, keep, delta);
    };
    auto draw_keep = [&](int n_block, uint32_t(&keep)[2]) {
      keep[0] = keep[1] = 0;
      if (p.dropout_threshold != 0)
        draw_keep_bits<kNTiles>(p, b, row0, n_block * kBlockN, quad_col, keep);
    };

    wait_landed(q_barrier, 0);
    if (consumer == 1) ptx::named_barrier_arrive(1, kConsumerThreads);  // consumer 0 goes first

    uint32_t keep[2];
    draw_keep(b.n_block_begin, keep);
    wait_landed(full_barrier(0), 0);
    ptx::named_barrier_sync(my_turn, kConsumerThreads);
    ptx::wgmma_fence();
    issue_s_dp(0);
    ptx::named_barrier_arrive(their_turn, kConsumerThreads);
    ptx::wgmma_wait<0>();
    ptx::fence_accumulators(s);
    ptx::fence_accumulators(dp);
    logit_gradients(b.n_block_begin, keep);
    pack_operands<Element>(s, du_operand);

#pragma unroll 1
    for (int it = 1; it < tiles; ++it) {
      const int stage = it % kStages, previous = (it - 1) % kStages;
      const int n_block = b.n_block_begin + it;
      draw_keep(n_block, keep);
      wait_landed(full_barrier(stage), (it / kStages) & 1);
      ptx::named_barrier_sync(my_turn, kConsumerThreads);
      ptx::fence_accumulators(dq_acc);
      ptx::wgmma_fence();
      issue_s_dp(stage);
      issue_dq(previous);  // dU(n-1) K(n-1)
      ptx::named_barrier_arrive(their_turn, kConsumerThreads);
      ptx::wgmma_wait<1>();  // S(n) and dP(n) are ready; dq may still run
      ptx::fence_accumulators(s);
      ptx::fence_accumulators(dp);
      logit_gradients(n_block, keep);
      ptx::wgmma_wait<0>();
      ptx::fence_accumulators(dq_acc);
      ptx::fence_registers(du_operand);
      ptx::mbarrier_arrive(empty_barrier(previous));  // K(n-1) and V(n-1) are read
      pack_operands<Element>(s, du_operand);
    }

    // dq += dU(last) K(last).
    ptx::named_barrier_sync(my_turn, kConsumerThreads);
    ptx::fence_accumulators(dq_acc);
    ptx::wgmma_fence();
    issue_dq((tiles - 1) % kStages);
    ptx::named_barrier_arrive(their_turn, kConsumerThreads);
    ptx::wgmma_wait<0>();
    ptx::fence_accumulators(dq_acc);
    ptx::fence_registers(du_operand);
    if (consumer == 0) ptx::named_barrier_sync(my_turn, kConsumerThreads);  // balance
  }

  store_dq_rows<Element, kDimQK>(bp, b, dq_acc, row0, quad_col);
#else
  (void)bp;  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

// ---- Producer steps shared by the key-owning kernels (the warp-specialised dk/dv kernel and
// the one-kernel backward, flash_backward_sm90_one_kernel.cuh) ----

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

// No stores of the producer beside a query tile's rows and statistics.
struct NoTileExtras {
  __device__ void operator()() const {}
};

// Iteration it's Q and dO rows (cp.async) and its rows' LSE (as row_lse_log2) and D (plain
// loads and stores by the first 2 kBlockM producer threads, each followed by a plain arrive):
// `full_barrier` counts 128 cp.async arrivals and 2 kBlockM plain ones. `extras` runs in every
// producer thread before those stores; what it stores is released with them by the threads
// that arrive.
template <typename Element, int kBlockM, int kDimQK, int kDimV, typename Extras = NoTileExtras>
__device__ __forceinline__ void produce_query_tile(const FlashBackwardParams& bp,
                                                   const KeyBlock& kb, int it, uint32_t q_shared,
                                                   uint32_t do_shared, float* lse, float* delta,
                                                   uint32_t full_barrier, Extras extras = {}) {
  static_assert(2 * kBlockM <= 128, "the producer warpgroup stores each row's LSE and D");
  const FlashForwardParams& p = bp.fwd;
  const int head = kb.head(it), i0 = kb.first_query(it);
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
  extras();
  const int r = int(threadIdx.x);
  if (r < 2 * kBlockM) {
    const int i = i0 + r % kBlockM;
    if (r < kBlockM)
      lse[r] = row_lse_log2(p, kb.batch, head, i, kb.seqlen_q);
    else
      delta[r - kBlockM] = row_delta_of(bp, kb.batch, head, i, kb.seqlen_q);
    ptx::mbarrier_arrive(full_barrier);  // release: the store above is visible
  }
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_backward_dkdv_sm90_ws_kernel(const __grid_constant__ FlashBackwardParams bp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  const FlashForwardParams& p = bp.fwd;
  constexpr int kBlockN = Traits::kDkvBlockN, kBlockM = Traits::kDkvBlockM;
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  constexpr int kStages = Traits::kStages, kConsumerThreads = Traits::kConsumerThreads;
  constexpr int kMTiles = kBlockM / 8;

  extern __shared__ __align__(1024) unsigned char shared_storage[];
  const uint32_t base = (ptx::shared_address(shared_storage) + 1023u) & ~1023u;
  const uint32_t k_shared = base;
  const uint32_t v_shared = k_shared + kBlockN * kDimQK * 2;
  const uint32_t stages = v_shared + kBlockN * kDimV * 2;
  auto q_shared = [&](int stage) { return stages + uint32_t(stage) * kBlockM * kDimQK * 2; };
  auto do_shared = [&](int stage) {
    return stages + kStages * kBlockM * kDimQK * 2 + uint32_t(stage) * kBlockM * kDimV * 2;
  };
  const uint32_t tiles_end = stages + kStages * kBlockM * (kDimQK + kDimV) * 2;
  // Generic pointers for the plain loads and stores: the rows' LSE (log2 units) and D per
  // stage, then the consumer warps' keep masks; the mbarriers after them.
  unsigned char* const generic = shared_storage + (tiles_end - ptx::shared_address(shared_storage));
  float* lse_stages = reinterpret_cast<float*>(generic);  // kStages x kBlockM
  float* delta_stages = lse_stages + kStages * kBlockM;   // kStages x kBlockM
  uint8_t* masks = reinterpret_cast<uint8_t*>(delta_stages + kStages * kBlockM);  // 8 x 64
  const uint32_t barriers = tiles_end + kStages * 2 * kBlockM * 4 + 8 * 2 * kBlockM;
  auto full_barrier = [&](int stage) { return barriers + 8u * stage; };
  auto empty_barrier = [&](int stage) { return barriers + 8u * (kStages + stage); };
  const uint32_t kv_barrier = barriers + 8u * (2 * kStages);

  KeyBlock kb;
  if (!make_key_block(p, kBlockN, kBlockM, kb)) return;

  // 128 cp.async arrivals + 2 kBlockM plain ones per stage (produce_query_tile).
  constexpr int kFullArrivals = 128 + 2 * kBlockM;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(full_barrier(s), kFullArrivals);
      ptx::mbarrier_init(empty_barrier(s), kConsumerThreads);
    }
    ptx::mbarrier_init(kv_barrier, 128);
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    ptx::setmaxnreg_decrease<40>();
    if (kb.iterations == 0) return;
    produce_key_block<Element, kBlockN, kDimQK, kDimV>(p, kb, k_shared, v_shared, kv_barrier);
#pragma unroll 1
    for (int it = 0; it < kb.iterations; ++it) {
      const int stage = it % kStages;
      if (it >= kStages) ptx::mbarrier_wait(empty_barrier(stage), (it / kStages - 1) & 1);
      produce_query_tile<Element, kBlockM, kDimQK, kDimV>(
          bp, kb, it, q_shared(stage), do_shared(stage), lse_stages + stage * kBlockM,
          delta_stages + stage * kBlockM, full_barrier(stage));
    }
    ptx::cp_async_commit();  // leave no copy of this thread in flight at exit
    ptx::cp_async_wait<0>();
    return;
  }

  ptx::setmaxnreg_increase<232>();
  const int consumer = warpgroup - 1;
  const int warp_in_group = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int warp_key0 = kb.j0 + consumer * 64 + warp_in_group * 16;
  const int key0 = warp_key0 + quad_row;
  uint8_t* keep_masks = masks + (consumer * 4 + warp_in_group) * 2 * kBlockM;  // this warp's
  const int my_turn = 1 + consumer, their_turn = 2 - consumer;

  float dk_acc[kDimQK / 8][4], dv_acc[kDimV / 8][4];
  zero_fragments(dk_acc);
  zero_fragments(dv_acc);
  if (kb.iterations > 0) {
    auto wait_landed = [&](uint32_t barrier, uint32_t parity) {
      ptx::mbarrier_wait(barrier, parity);
      ptx::fence_proxy_async_shared();
    };
    float s[kMTiles][4], dp[kMTiles][4], derivative[kMTiles][4], p_dropped[kMTiles][4];
    uint32_t pd_operand[kBlockM / 16][4], du_operand[kBlockM / 16][4];
    auto issue_s_dp = [&](int stage) {
      wgmma_rows_by_rows<Element, kBlockM, kDimQK>(s, k_shared, kBlockN, consumer * 64,
                                                   q_shared(stage));
      wgmma_rows_by_rows<Element, kBlockM, kDimV>(dp, v_shared, kBlockN, consumer * 64,
                                                  do_shared(stage));
      ptx::wgmma_commit();
    };
    auto issue_dv_dk = [&](int stage) {
      wgmma_fragments_by_rows<Element, kDimV, kBlockM>(dv_acc, pd_operand, do_shared(stage));
      wgmma_fragments_by_rows<Element, kDimQK, kBlockM>(dk_acc, du_operand, q_shared(stage));
      ptx::wgmma_commit();
    };
    // Pd^T (into p_dropped) and dU^T (into s) of iteration it, once S^T and dP^T are ready.
    auto logit_gradients = [&](int it, int stage) {
      const KeyTile key_tile = key_tile_of(p, kb, it);
      const int i0 = kb.first_query(it);
      uint32_t keep = 0;
      key_tile_probabilities(p, key_tile, s, derivative, p_dropped, keep, key0, i0, quad_row,
                             quad_col, lse_stages + stage * kBlockM, keep_masks);
      key_tile_logit_gradients(p, s, dp, derivative, keep, delta_stages + stage * kBlockM,
                               quad_col);  // s becomes dU^T
    };
    auto draw_masks = [&](int it) {
      if (p.dropout_threshold == 0) return;
      const KeyTile key_tile = key_tile_of(p, kb, it);
      __syncwarp();  // every lane has read the previous iteration's masks
      draw_key_tile_keep_masks(p, key_tile, kb.first_query(it), warp_key0, lane, keep_masks);
    };

    wait_landed(kv_barrier, 0);
    if (consumer == 1) ptx::named_barrier_arrive(1, kConsumerThreads);  // consumer 0 goes first

    draw_masks(0);
    wait_landed(full_barrier(0), 0);
    ptx::named_barrier_sync(my_turn, kConsumerThreads);
    ptx::wgmma_fence();
    issue_s_dp(0);
    ptx::named_barrier_arrive(their_turn, kConsumerThreads);
    ptx::wgmma_wait<0>();
    ptx::fence_accumulators(s);
    ptx::fence_accumulators(dp);
    logit_gradients(0, 0);
    pack_operands<Element>(p_dropped, pd_operand);
    pack_operands<Element>(s, du_operand);

#pragma unroll 1
    for (int it = 1; it < kb.iterations; ++it) {
      const int stage = it % kStages, previous = (it - 1) % kStages;
      draw_masks(it);
      wait_landed(full_barrier(stage), (it / kStages) & 1);
      ptx::named_barrier_sync(my_turn, kConsumerThreads);
      ptx::fence_accumulators(dk_acc);
      ptx::fence_accumulators(dv_acc);
      ptx::wgmma_fence();
      issue_s_dp(stage);
      issue_dv_dk(previous);  // iteration it - 1's dv and dk
      ptx::named_barrier_arrive(their_turn, kConsumerThreads);
      ptx::wgmma_wait<1>();  // S^T(it) and dP^T(it) are ready; dv, dk may still run
      ptx::fence_accumulators(s);
      ptx::fence_accumulators(dp);
      logit_gradients(it, stage);
      ptx::wgmma_wait<0>();
      ptx::fence_accumulators(dk_acc);
      ptx::fence_accumulators(dv_acc);
      ptx::fence_registers(pd_operand);
      ptx::fence_registers(du_operand);
      ptx::mbarrier_arrive(empty_barrier(previous));  // Q, dO, LSE, D of it - 1 are read
      pack_operands<Element>(p_dropped, pd_operand);
      pack_operands<Element>(s, du_operand);
    }

    // The last iteration's dv and dk.
    ptx::named_barrier_sync(my_turn, kConsumerThreads);
    ptx::fence_accumulators(dk_acc);
    ptx::fence_accumulators(dv_acc);
    ptx::wgmma_fence();
    issue_dv_dk((kb.iterations - 1) % kStages);
    ptx::named_barrier_arrive(their_turn, kConsumerThreads);
    ptx::wgmma_wait<0>();
    ptx::fence_accumulators(dk_acc);
    ptx::fence_accumulators(dv_acc);
    ptx::fence_registers(pd_operand);
    ptx::fence_registers(du_operand);
    if (consumer == 0) ptx::named_barrier_sync(my_turn, kConsumerThreads);  // balance
  }

  store_key_block_gradients<Element, kDimQK, kDimV>(bp, kb, dk_acc, dv_acc, key0, quad_col);
#else
  (void)bp;  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace dpa::cuda
