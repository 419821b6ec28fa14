// The ping-pong form of the fused backward (sm_90a, head dims 64 and 128; opt-in
// DPA_FLASH_BACKWARD_KERNEL=fused_pingpong until a GPU run has validated and measured it).
//
// The fused kernel (flash_backward_sm90_fused.cuh) computes dq_tile = dU K over both consumers'
// keys, so its two consumer warpgroups meet at a barrier every tile and run their elementwise
// phases at the same time, leaving the tensor cores idle (ncu: 27% tensor utilisation; with
// softcap 50 the phase is three MUFU ops per element and the kernel stays at 0.81x SDPA-flash).
// Here each consumer computes the dq partial of its own 64 keys, so nothing couples the
// consumers but the order in which they issue their MMAs: as the warp-specialised forward,
// they take turns (named barriers 1 and 2), two per tile:
//   turn A: S^T = K_c Q^T and dP^T = V_c dO^T          (c: the consumer's 64 keys)
//   [P^T, dU^T in registers: the other consumer's MMAs run meanwhile]
//   turn B: dv += P^T dO, dk += dU^T Q (registers x shared), dU^T into the consumer's own
//           shared buffer, dq partial = dU K_c over the first 64 of the head dim's columns
//   then, outside the turns: the second 64 columns (head dim 128), each half stored as fp32
//   into the consumer's own dq buffer.
// The producer warpgroup sums the two consumers' partials and adds them to the workspace
// (coalesced 16-byte reductions), as in the fused kernel. Registers: dk and dv (128 at head
// dim 128) plus S^T and dP^T (64) in turn A; plus P^T, dU^T operands (32) and one 64-column
// dq half (32) in turn B.
#pragma once

#include "cuda/flash/flash_backward_sm90_fused.cuh"

namespace dpa::cuda {

// Each consumer's dU^T (64 keys x 64 queries) and dq partial.
template <typename ElementT, int kHeadDimQKT, int kHeadDimVT>
struct FlashBackwardSm90PingPongTraits
    : FusedBackwardTraitsBase<ElementT, kHeadDimQKT, kHeadDimVT, 2 * 64 * 64 * 2, 2> {
  static constexpr int kDqHalves = kHeadDimQKT / 64;  // 64-column blocks of dq
};

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_backward_pingpong_sm90_kernel(const __grid_constant__ FlashBackwardParams bp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  const FlashForwardParams& p = bp.fwd;
  constexpr int kBlockN = Traits::kBlockN, kBlockM = Traits::kBlockM;
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  constexpr int kStages = Traits::kStages, kConsumerThreads = Traits::kConsumerThreads;
  constexpr int kMTiles = kBlockM / 8, kDqHalves = Traits::kDqHalves;
  constexpr int kDqStride = Traits::kDqStride;

  extern __shared__ __align__(1024) unsigned char shared_storage[];
  const FusedBackwardLayout<Traits> l(shared_storage);
  auto du_shared = [&](int consumer) { return l.du + uint32_t(consumer) * 64 * kBlockM * 2; };

  KeyBlock kb;
  if (!make_key_block(p, kBlockN, kBlockM, kb)) return;
  init_fused_backward_barriers(l);
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    ptx::setmaxnreg_decrease<40>();
    if (kb.iterations > 0) run_fused_backward_producer(bp, kb, l);
    return;
  }

  ptx::setmaxnreg_increase<232>();
  const int consumer = warpgroup - 1;
  const int warp_in_group = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int key_row = warp_in_group * 16 + quad_row;  // in the consumer's 64 keys
  const int key0 = kb.j0 + consumer * 64 + key_row;
  const int my_turn = 1 + consumer, their_turn = 2 - consumer;  // named barrier ids
  const uint32_t du_own = du_shared(consumer);
  // This consumer's 64 keys of K, the B operand of its dq partial (MN-major: keys along the
  // rows, the head dim's 64-column blocks kBlockN * 128 bytes apart).
  const uint32_t k_own = l.k + uint32_t(consumer * 64 * 128);
  float* const dq_own = l.dq + consumer * kBlockM * kDqStride;

  float dk_acc[kDimQK / 8][4], dv_acc[kDimV / 8][4];
  zero_fragments(dk_acc);
  zero_fragments(dv_acc);
  if (kb.iterations > 0) {
    float s[kMTiles][4], dp[kMTiles][4], dq_half[8][4];
    uint32_t derivative[kMTiles][2];
    uint32_t pd_operand[kBlockM / 16][4], du_operand[kBlockM / 16][4];

    // dq_half = dU K_c over the consumer's 64 keys, the head dim's 64-column block `half`
    // (issue only).
    auto issue_dq_half = [&](int half) {
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 64 / 16; ++kk)
        ptx::wgmma_ss_mn_major<Element, 64>(
            dq_half, mn_major_descriptor(du_own, 64, kk),
            mn_major_descriptor(k_own + uint32_t(half * kBlockN * 128), 64, kk), kk > 0);
      ptx::wgmma_commit();
    };
    // Waits for dq_half and stores it (fp32) into the consumer's dq partial.
    auto store_dq_half = [&](int half) {
      ptx::wgmma_wait<0>();
      ptx::fence_accumulators(dq_half);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // Accumulator rows are queries: warp w holds rows 16 w + g and 16 w + g + 8.
        float* row =
            dq_own + (warp_in_group * 16 + quad_row + 8 * h) * kDqStride + 64 * half + 2 * quad_col;
#pragma unroll
        for (int t = 0; t < 8; ++t)
          *reinterpret_cast<float2*>(row + 8 * t) =
              make_float2(dq_half[t][2 * h], dq_half[t][2 * h + 1]);
      }
    };

    ptx::mbarrier_wait(l.kv(), 0);
    ptx::fence_proxy_async_shared();
    if (consumer == 1) ptx::named_barrier_arrive(1, kConsumerThreads);  // consumer 0 goes first

#pragma unroll 1
    for (int it = 0; it < kb.iterations; ++it) {
      const int stage = it % kStages;
      ptx::mbarrier_wait(l.full(stage), (it / kStages) & 1);
      ptx::fence_proxy_async_shared();

      // Turn A: S^T and dP^T, one group each (P^T is computed while dP^T runs).
      ptx::named_barrier_sync(my_turn, kConsumerThreads);
      ptx::wgmma_fence();
      wgmma_rows_by_rows<Element, kBlockM, kDimQK>(s, l.k, kBlockN, consumer * 64, l.q(stage));
      ptx::wgmma_commit();
      wgmma_rows_by_rows<Element, kBlockM, kDimV>(dp, l.v, kBlockN, consumer * 64, l.d_o(stage));
      ptx::wgmma_commit();
      ptx::named_barrier_arrive(their_turn, kConsumerThreads);

      const KeyTile key_tile = key_tile_of(p, kb, it);
      const int i0 = kb.first_query(it), warp_key0 = key0 - quad_row;
      const bool fully_visible =
          tile_fully_visible(p, key_tile, i0, i0 + kBlockM - 1, warp_key0, warp_key0 + 15);
      ptx::wgmma_wait<1>();
      ptx::fence_accumulators(s);
      key_tile_probabilities_no_dropout(p, key_tile, s, derivative, key0, i0, quad_col,
                                        l.lse + stage * kBlockM, fully_visible);
      ptx::wgmma_wait<0>();
      ptx::fence_accumulators(dp);
      key_tile_gradients_no_dropout(p, s, dp, derivative, quad_col, l.delta + stage * kBlockM);
      pack_operands<Element>(s, pd_operand);
      pack_operands<Element>(dp, du_operand);

      // dU^T into the consumer's buffer (its previous reader, the last tile's dq, is done);
      // turn B's barrier, which all 128 of its threads pass, orders these writes before the
      // dq product reads them.
      store_key_major_operands(du_own, du_operand, key_row, quad_col);
      ptx::fence_proxy_async_shared();

      // Turn B: dv, dk and the first dq half.
      ptx::named_barrier_sync(my_turn, kConsumerThreads);
      ptx::fence_accumulators(dk_acc);
      ptx::fence_accumulators(dv_acc);
      ptx::wgmma_fence();
      wgmma_fragments_by_rows<Element, kDimV, kBlockM>(dv_acc, pd_operand, l.d_o(stage));
      wgmma_fragments_by_rows<Element, kDimQK, kBlockM>(dk_acc, du_operand, l.q(stage));
      ptx::wgmma_commit();
      issue_dq_half(0);
      ptx::named_barrier_arrive(their_turn, kConsumerThreads);

      ptx::wgmma_wait<1>();  // dv and dk are done; the dq half may still run
      ptx::fence_accumulators(dk_acc);
      ptx::fence_accumulators(dv_acc);
      ptx::fence_registers(pd_operand);
      ptx::fence_registers(du_operand);
      ptx::mbarrier_arrive(l.empty(stage));  // Q, dO, LSE, D of this iteration are read

      // The producer has added the previous tile's partials (their rows are free).
      if (it > 0) ptx::mbarrier_wait(l.dq_empty(), (it - 1) & 1);
      store_dq_half(0);
#pragma unroll
      for (int half = 1; half < kDqHalves; ++half) {
        issue_dq_half(half);
        store_dq_half(half);
      }
      ptx::mbarrier_arrive(l.dq_full());  // release: the partial's rows are visible
    }
    if (consumer == 0) ptx::named_barrier_sync(my_turn, kConsumerThreads);  // balance
  }

  store_key_block_gradients<Element, kDimQK, kDimV>(bp, kb, dk_acc, dv_acc, key0, quad_col);
#else
  (void)bp;  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace dpa::cuda
