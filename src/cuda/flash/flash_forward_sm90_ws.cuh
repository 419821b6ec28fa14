// The warp-specialised wgmma flash forward (sm_90a): a producer warpgroup copies Q, K and V
// into shared memory; two to four consumer warpgroups of 64 query rows
// (flash_forward_wgmma_ws_consumers, kFlashPackedConsumers) run the tile math of
// flash_tile_math.cuh on warpgroup MMAs (S = Q K^T with both operands K-major in shared memory; O
// += P V with P from registers, the S accumulators rounded in place, and V as an MN-major operand;
// 128-byte-swizzled tiles, ptx/wgmma.cuh), scheduled in ping-pong so that one warpgroup's softmax
// runs while another's MMAs occupy the tensor cores (FlashAttention-3's schedule). Without it the
// warpgroups wait for S at the same time and the tensor cores idle through the S latency. It is the
// only sm_90a forward: the plain two-warpgroup form without a producer went in session 32, once no
// head dim ran it by default (docs/cuda_flash.md).
//
// - Stages: K and V of one tile share a stage; kStages stages (3 where they fit). With two
//   stages K and V each have a full and an empty barrier per stage, with three one pair serves
//   both (kSeparateKvBarriers). k_full[s] / v_full[s] complete when the producer's copies of
//   the tile's K / V landed (TMA's bytes, or every copying thread's
//   cp.async.mbarrier.arrive.noinc, which arrives once its copies complete), so the producer
//   runs ahead by up to kStages tiles without waiting for any copy. With separate barriers
//   k_empty[s] completes when every consumer warpgroup has S(n) (K(n) is read) and v_empty[s]
//   when it has P(n) V(n), an iteration later; with one pair the stage is released after
//   P(n) V(n). A consumer that saw a cp.async tile land issues fence.proxy.async before its
//   wgmma reads it (the copies were generic-proxy writes).
// - Ping-pong: consumer c waits on named barrier 1 + c before issuing its MMAs of a tile and
//   then releases the next one's barrier (c + 1, in a ring); the last consumer releases
//   consumer 0's barrier once up front. Arrivals and waits balance exactly (consumer 0 waits
//   once more at the end), so no barrier is left mid-phase when the block exits. Not at head
//   dim 256 (kTurns), whose consumers issue unordered.
// - Registers: the producer gives its registers to the consumers (setmaxnreg 24 / 240 with two
//   consumers, FlashAttention-3's split; 24 / 160 with three; 24 / 112 with four).
// - Within a consumer, FlashAttention-3's intra-warpgroup overlap: S(n) and P(n-1) V(n-1) are
//   issued together, and the softmax of tile n runs while P(n-1) V(n-1) does.
// - Persistent grid (p.persistent_blocks): each block loops over blocks of work w = blockIdx.x,
//   + gridDim.x, ... (query blocks fastest and last first, so the longest causal blocks start
//   early and concurrent blocks share their heads' K and V in L2). The stage ring runs on across
//   blocks of work, and Q has a second barrier, q_empty, which the consumers arrive on once
//   their last S = Q K^T of a block is done: the producer loads the next block's Q and first
//   K, V tiles while the consumers finish the last tile and store O. Q buffers form a ring
//   (kFlashForwardWsQBuffers of them: one, measured against two). The ping-pong alternation
//   runs on across blocks of work too (every consumer visits the same tiles).
#pragma once

#include <type_traits>

#include "cuda/flash/flash_forward_sm90_descriptors.cuh"
#include "cuda/flash/flash_tile_math.cuh"
#include "cuda/flash/flash_tiles.h"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/swizzled_tile_copies.cuh"

namespace dpa::cuda {

// kBlockNT, kStagesT (0: flash_forward_wgmma_ws_stages) and kConsumersT (consumer warpgroups of
// 64 rows) default to what the library runs (flash_forward_wgmma_ws_tile_shape); dev benches
// instantiate others to compare.
template <typename ElementT, int kHeadDimQKT, int kHeadDimVT,
          int kBlockNT = flash_forward_wgmma_ws_tile_shape(kHeadDimQKT, kHeadDimVT).block_n,
          int kStagesT = 0,
          int kConsumersT = flash_forward_wgmma_ws_tile_shape(kHeadDimQKT, kHeadDimVT).block_m / 64>
struct FlashSm90WsTraits {
  using Element = ElementT;
  static constexpr int kHeadDimQK = kHeadDimQKT, kHeadDimV = kHeadDimVT;
  static constexpr int kConsumers = kConsumersT;
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = kBlockNT;
  static constexpr int kThreads = 128 * (1 + kConsumers);  // producer warpgroup + consumers
  // setmaxnreg: the producer's registers go to the consumers. The pool is the block's registers
  // at launch: 65536 / kThreads per thread (__launch_bounds__(kThreads, 1)), rounded down to 8.
  // With two consumers, 232 registers left ptxas 28 bytes of the consumers' state to spill at
  // d = 128 (with the softcap's shared reciprocals); 240 hold it, and the producer's 24 spill a
  // few words of the cp.async copies' addresses per block of work (the TMA path spills none;
  // FlashAttention-3 gives a cp.async producer 40 / 232). With three consumers at d = 64, 152
  // registers made ptxas serialise the wgmmas (C7512); 160 do not (ptxas -v: 52 bytes of spills
  // in all, from the capped masked tiles' peak and the producer's 24; the pool would allow 32).
  // With four (GQA packing's 64-key tiles at d = 64, kFlashPackedConsumers) the pool is 96 per
  // thread, and 112 hold a consumer's S, P and O without spills or serialised wgmmas.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 240 : kConsumers == 3 ? 160 : 112;
  static constexpr int kLaunchRegisters = 65536 / (128 * (1 + kConsumers)) / 8 * 8;
  static constexpr int kQBytes = kBlockM * kHeadDimQK * 2;
  static constexpr int kKBytes = kBlockN * kHeadDimQK * 2;
  static constexpr int kVBytes = kBlockN * kHeadDimV * 2;
  static constexpr int kBarrierBytes = kFlashWsBarrierBytes;
  static constexpr int kStages = kStagesT > 0 ? kStagesT
                                              : flash_forward_wgmma_ws_stages(kHeadDimQK, kHeadDimV,
                                                                              kBlockM, kBlockN);
  static constexpr int kQBuffers = kFlashForwardWsQBuffers;
  static constexpr int kSharedBytes =
      kQBuffers * kQBytes + kStages * (kKBytes + kVBytes) + 1024 + kBarrierBytes;
  // K and V of a stage on barriers of their own where there are only two stages (below, at
  // the barriers' definition); with three, one pair of barriers for both.
  static constexpr bool kSeparateKvBarriers = kStages == 2;
  static_assert(sizeof(Element) == 2, "16-bit elements");
  static_assert(4 * kStages + 2 * kQBuffers <= kFlashWsMbarrierBytes / 8,
                "mbarriers fit their slot");
  static_assert(4 * kQBuffers <= kFlashWsBlockIdBytes, "one block id per Q buffer");
  // One stage would deadlock: a consumer waits for tile n before it releases tile n - 1.
  static_assert(kStages >= 2, "at least two stages");
  static_assert(kConsumers >= 2 && kConsumers <= 4, "named barriers 1-4 order the consumers");
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * 128 * kConsumers <=
                    kLaunchRegisters * kThreads,
                "setmaxnreg within the registers the block launched with");
  static_assert(kSharedBytes <= 227 * 1024, "tile does not fit sm_90 shared memory");
};

// kForm (FlashLogitForm, chosen by flash_forward_logit_form): the general kernel tests every
// feature at run time; the plain and fixed-max softcap kernels compile only their own logit
// transform into the consumers' loop (no ALiBi or dropout code, the max's kind a constant).
template <typename Traits, FlashLogitForm kForm>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_forward_sm90_ws_kernel(const __grid_constant__ FlashForwardParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kPlain = kForm == FlashLogitForm::kPlain;
  constexpr bool kSoftcapFixedMax = kForm == FlashLogitForm::kSoftcapFixedMax;
  constexpr bool kGeneral = kForm == FlashLogitForm::kGeneral;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  constexpr int kStages = Traits::kStages;
  constexpr int kNTiles = kBlockN / 8;
  constexpr int kVTiles = kDimV / 8;
  constexpr int kConsumers = Traits::kConsumers;
  constexpr int kConsumerThreads = 128 * kConsumers;
  // Tiles of other key counts (d = 256's 80 keys) take neither paged caches nor dropout: a paged
  // tile is whole boxes of pages, and the quads draw four Philox blocks at a time
  // (flash_forward_wgmma_ws_block_n; launch_flash_forward_ws_kernel refuses both).
  constexpr bool kPowerOfTwoTile = (kBlockN & (kBlockN - 1)) == 0;

  extern __shared__ __align__(1024) unsigned char shared_ws[];
  const uint32_t shared_base = (ptx::shared_address(shared_ws) + 1023u) & ~1023u;
  constexpr int kQBuffers = Traits::kQBuffers;
  constexpr uint32_t kAllQBytes = kQBuffers * Traits::kQBytes;
  auto q_shared = [&](int buffer) { return shared_base + uint32_t(buffer) * Traits::kQBytes; };
  auto k_shared = [&](int stage) {
    return shared_base + kAllQBytes + uint32_t(stage) * Traits::kKBytes;
  };
  auto v_shared = [&](int stage) {
    return shared_base + kAllQBytes + kStages * Traits::kKBytes + uint32_t(stage) * Traits::kVBytes;
  };
  const uint32_t barriers =
      shared_base + kAllQBytes + kStages * (Traits::kKBytes + Traits::kVBytes);
  // With two stages (d = 256) K and V of a stage have their own barriers (FlashAttention-3's
  // two pipelines): a consumer is done with K(n) once S(n) is computed, an iteration before it
  // is done with V(n) (P(n) V(n) runs under S(n + 1)), so K(n + 2) can load a whole iteration
  // earlier than a barrier for both would allow. That iteration is all the slack a two-stage
  // producer has: on one barrier per stage the consumers waited for every tile's copies
  // (session 26's profile: 38% of the d256 kernel's samples on one try-wait loop; separate
  // barriers took it 1.48-1.69x faster, session 27). Three stages already give the producer
  // that iteration, and there the second pair cost the consumers a wait and an arrival per
  // tile for nothing (0.96-0.98x at d = 64 and 128): v_full and v_empty are then K's barriers,
  // which count both copies and both reads.
  constexpr bool kSeparateKv = Traits::kSeparateKvBarriers;
  auto k_full = [&](int stage) { return barriers + 8u * stage; };
  auto k_empty = [&](int stage) { return barriers + 8u * (kStages + stage); };
  auto v_full = [&](int stage) {
    return kSeparateKv ? barriers + 8u * (2 * kStages + stage) : k_full(stage);
  };
  auto v_empty = [&](int stage) {
    return kSeparateKv ? barriers + 8u * (3 * kStages + stage) : k_empty(stage);
  };
  // Block of work r (its `round`) reads Q buffer r % kQBuffers, in phase r / kQBuffers of its
  // barriers.
  auto q_full = [&](int buffer) { return barriers + 8u * (4 * kStages + buffer); };
  // Dynamic scheduling (p.tile_counter): the block of work in Q buffer b, written by the
  // producer before its q_full arrival and read by the consumers after their wait.
  auto block_id = [&](int buffer) { return barriers + kFlashWsMbarrierBytes + 4u * buffer; };
  auto q_empty = [&](int buffer) { return barriers + 8u * (4 * kStages + kQBuffers + buffer); };

  // Blocks of work: query blocks (fastest, last first), heads, batch * splits. With GQA
  // packing a block is block_positions positions of the packed heads, named by the first.
  const int block_positions = kBlockM / p.packed_heads;
  const int head_groups = p.heads_q / p.packed_heads;
  const int m_blocks = (p.max_seqlen_q + block_positions - 1) / block_positions;
  const int work_count = m_blocks * head_groups * p.batch * p.num_splits;
  auto block_of = [&](int w, FlashBlock<Element>& b) {
    const int rest = w / m_blocks;
    return make_flash_block(p, block_positions, kBlockN, m_blocks - 1 - w % m_blocks,
                            rest % head_groups * p.packed_heads, rest / head_groups, b);
  };

  // A stage's K or V is full after one expect-tx arrival and its bytes (TMA), or after the
  // cp.async arrivals of the threads that copy it: warp 0 with TMA where some key tiles cross a
  // sequence's end inside the tensor (p.tma_tails), the warpgroup without TMA.
  // With pages (whose TMA tiles take a box per page, and always tails) warp 1 of the producer
  // issues V's boxes and adds one arrival to V's barrier: a tile of 16-key pages is 8 boxes per
  // tensor, and one warp issuing all 16 in turn is the suspect in the 16-key-page prefill's
  // last 12% against a contiguous cache (docs/perf.md, session 29).
  // With dynamic scheduling (p.tile_counter) warp 0 stays whole as well: lane 0 claims each block
  // of work and a shuffle hands the claim to the warp, so that ptxas knows it is warp-uniform (a
  // claim by one thread moved the producer's uniform values into its 24 registers: about 130
  // bytes of spills).
  const bool dynamic = p.tile_counter != nullptr;
  const bool whole_producer_warp = p.tma_tails || dynamic;
  const uint32_t producer_arrivals = p.tma ? (whole_producer_warp ? 32 : 1) : 128;
  const bool v_by_warp1 = p.tma && p.block_table != nullptr;
  const uint32_t v_arrivals = producer_arrivals + (v_by_warp1 ? 1 : 0);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(k_full(s), kSeparateKv ? producer_arrivals : v_arrivals);
      ptx::mbarrier_init(k_empty(s), kConsumerThreads);
      if constexpr (kSeparateKv) {
        ptx::mbarrier_init(v_full(s), v_arrivals);
        ptx::mbarrier_init(v_empty(s), kConsumerThreads);
      }
    }
    for (int buffer = 0; buffer < kQBuffers; ++buffer) {
      ptx::mbarrier_init(q_full(buffer), producer_arrivals);
      ptx::mbarrier_init(q_empty(buffer), kConsumerThreads);
    }
  }
  __syncthreads();

  // Whether the key tile at n0 comes by cp.async, zero-filled past the sequence: without TMA,
  // and with it where the rows past the sequence are inside the tensor (padding, the next
  // packed sequence, a cache's stale rows): 0 * NaN there would reach O.
  auto copied_by_threads = [&](int n0, int seqlen_kv) {
    return !p.tma || (p.tma_tails && n0 + kBlockN > seqlen_kv);
  };

  // Producer and consumers count the same tiles: `round` blocks of work with tiles (Q's
  // barrier phases) and `issued` KV tiles (the stage ring's position).
  // Broadcast from lane 0 so the compiler knows it is warp-uniform: what derives from it (the
  // consumer's Q descriptors) then lives in uniform registers.
  const int warpgroup = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
  if (warpgroup == 0 && p.tma) {
    // Producer with TMA: lane 0 of warp 0 issues Q's copies, and K's and V's boxes of 64
    // columns (with pages, lane i of the issuing warp the box of page i of the tile, see
    // below); the copy engine writes the swizzled tiles and counts their bytes on the stage's
    // barrier. With tails, the rest of warp 0 stays to copy the tiles that cross a sequence's
    // end with cp.async, and arrives on the other tiles' barriers. With pages (always with
    // tails, and at most 32 boxes a tile: launch_flash_forward_ws_kernel checks both), warp 1
    // issues V's boxes while warp 0 issues K's (v_by_warp1).
    ptx::setmaxnreg_decrease<Traits::kProducerRegisters>();
    const int thread = int(threadIdx.x), lane = thread % 32;
    // Broadcast so that ptxas knows the role is warp-uniform (a per-thread test moved the
    // producer's uniform values into its 24 registers: 168 bytes of spills).
    const bool v_warp = __shfl_sync(0xffffffffu, v_by_warp1 && thread / 32 == 1, 0);
    if (thread >= (whole_producer_warp ? 32 : 1) && !v_warp) return;
    const unsigned producer_lanes = whole_producer_warp ? 0xffffffffu : 1u;
    if (thread == 0) {
      ptx::prefetch_tensor_map(&p.q_map);
      ptx::prefetch_tensor_map(&p.k_map);
      ptx::prefetch_tensor_map(&p.v_map);
    }
    // A packed (thd) tensor's map has one batch of all its rows; a paged cache's has one
    // batch per page, whose boxes are min(page size, kBlockN) rows.
    const int page_mask = (1 << p.page_shift) - 1;
    const int box_rows = p.block_table ? min(page_mask + 1, kBlockN) : kBlockN;
    // The boxes of the key tile at n0, 64 columns each: its rows all at once (lane 0), or one
    // page per lane (paged caches always have tails, so the whole warp is here). Each lane
    // loads its page once, before the wait for the stage, so a tile waits for one block-table
    // load, not one per box in turn (lane 0 alone made them one after another: 0.29 ms of the
    // 1.35 ms of a prefill over 16-key pages, docs/perf.md, session 29). ptxas issues the lanes'
    // copies one after another (an elect loop).
    struct TileBox {
      bool here;
      int row, batch;
    };
    auto tile_box = [&](int n0, int kv_row0, int kv_batch, const int* pages) {
      const int box_row = lane * box_rows, key = n0 + box_row;
      TileBox box;
      box.here = box_row < kBlockN;
      box.row = pages ? key & page_mask : kv_row0 + key;
      box.batch = pages ? (box.here ? pages[key >> p.page_shift] : 0) : kv_batch;
      return box;
    };
    auto load_boxes = [&](const TileBox& box, int kv_head, uint32_t tile, const void* map, auto dim,
                          uint32_t full) {
      if (!box.here) return;
#pragma unroll
      for (int c = 0; c < dim / 64; ++c)
        ptx::tma_load_4d(tile + c * (kBlockN * 128) + lane * box_rows * 128, map, 64 * c, box.row,
                         kv_head, box.batch, full);
    };
    int round = 0, issued = 0;
    // Dynamic scheduling (the plan sets it only without tails or pages, so warp 0 alone walks
    // the blocks of work): after blockIdx.x each block takes gridDim.x + the counter's next
    // value, and publishes every block of work it takes, those without tiles and the end (an
    // index past the work) included, through the Q buffers' barriers, so that the consumers
    // follow it.
    auto publish = [&](int w, bool with_q) {
      const int q_buffer = round % kQBuffers;
      if (round >= kQBuffers) ptx::mbarrier_wait(q_empty(q_buffer), (round / kQBuffers - 1) & 1);
      if (lane == 0) ptx::shared_store(block_id(q_buffer), w);
      if (!with_q) {
        ptx::mbarrier_arrive(q_full(q_buffer));
        ++round;
      }
    };
#pragma unroll 1
    for (int w = blockIdx.x;;) {
      if (w >= work_count) {
        if (dynamic && !v_warp) publish(work_count, false);
        break;
      }
      // The next block of work, claimed once this one is issued (a claim held across the tile
      // loop spilled the 24-register producer: about 130 bytes). The atomic's latency delays only
      // the next Q's load, which the consumers need a few tiles later.
      auto next = [&](int current) {
        if (!dynamic) return current + int(gridDim.x);
        const int claimed = lane == 0 ? ptx::global_fetch_add(p.tile_counter, 1) : 0;
        return int(gridDim.x) + __shfl_sync(0xffffffffu, claimed, 0);
      };
      FlashBlock<Element> b;
      if (!block_of(w, b) || b.n_block_end == b.n_block_begin) {
        if (dynamic && !v_warp) publish(w, false);
        w = next(w);
        continue;
      }
      const int kv_head = b.head / p.group_size;
      const int kv_row0 = p.start_kv ? p.start_kv[b.batch] : 0;
      const int kv_batch = p.start_kv ? 0 : b.batch;
      const int* pages = p.block_table ? p.block_table + b.batch * p.block_table_stride : nullptr;
      if (!v_warp) {
        const int q_buffer = round % kQBuffers;
        if (dynamic)
          publish(w, true);
        else if (round >= kQBuffers)
          ptx::mbarrier_wait(q_empty(q_buffer), (round / kQBuffers - 1) & 1);
        ++round;
        const int q_row = (p.start_q ? p.start_q[b.batch] : 0) + b.m0;
        const int q_batch = p.start_q ? 0 : b.batch;
        if (lane == 0) {
          ptx::mbarrier_arrive_expect_tx(q_full(q_buffer), Traits::kQBytes);
#pragma unroll
          for (int c = 0; c < kDimQK / 64; ++c)
            ptx::tma_load_4d(q_shared(q_buffer) + c * (kBlockM * 128), &p.q_map, 64 * c, q_row,
                             b.head, q_batch, q_full(q_buffer));
        } else {
          ptx::mbarrier_arrive(q_full(q_buffer));
        }
      }
#pragma unroll 1
      for (int n_block = b.n_block_begin; n_block < b.n_block_end; ++n_block, ++issued) {
        const int stage = issued % kStages;
        const uint32_t freed = (issued / kStages - 1) & 1;  // the parity of the slot's release
        const int n0 = n_block * kBlockN;
        if (v_warp) {
          // V's boxes, one arrival per tile (lane 0's): with its bytes for a TMA tile, plain
          // for a tile that warp 0 copies with cp.async. The wait for the stage's release also
          // orders the arrival after the barrier's previous phase.
          if (copied_by_threads(n0, b.seqlen_kv)) {
            if (issued >= kStages) ptx::mbarrier_wait(v_empty(stage), freed);
            if (lane == 0) ptx::mbarrier_arrive(v_full(stage));
          } else {
            const TileBox box = tile_box(n0, kv_row0, kv_batch, pages);
            if (issued >= kStages) ptx::mbarrier_wait(v_empty(stage), freed);
            if (lane == 0) ptx::mbarrier_arrive_expect_tx(v_full(stage), Traits::kVBytes);
            __syncwarp();
            load_boxes(box, kv_head, v_shared(stage), &p.v_map,
                       std::integral_constant<int, kDimV>{}, v_full(stage));
          }
          continue;
        }
        // K first, then V. With separate barriers each waits for its own slot (the consumers
        // release K(n) an iteration before V(n)); with one pair, the stage's one release.
        if (copied_by_threads(n0, b.seqlen_kv)) {
          const int valid_rows = b.seqlen_kv - n0;
          if (issued >= kStages) ptx::mbarrier_wait(k_empty(stage), freed);
          if (pages) {
            produce_paged_tile<Element, kBlockN, kDimQK, 32>(k_shared(stage), b.k, p.k_batch_stride,
                                                             p.k_row_stride, pages, p.page_shift,
                                                             n0, valid_rows);
          } else {
            produce_swizzled_tile<Element, kBlockN, kDimQK, 32>(
                k_shared(stage), b.k + int64_t(n0) * p.k_row_stride, p.k_row_stride, valid_rows);
          }
          if constexpr (kSeparateKv) {
            ptx::cp_async_mbarrier_arrive_noinc(k_full(stage));
            if (issued >= kStages) ptx::mbarrier_wait(v_empty(stage), freed);
          }
          if (pages) {
            produce_paged_tile<Element, kBlockN, kDimV, 32>(v_shared(stage), b.v, p.v_batch_stride,
                                                            p.v_row_stride, pages, p.page_shift, n0,
                                                            valid_rows);
          } else {
            produce_swizzled_tile<Element, kBlockN, kDimV, 32>(
                v_shared(stage), b.v + int64_t(n0) * p.v_row_stride, p.v_row_stride, valid_rows);
          }
          // Fires once all of this thread's copies have landed, V's and K's.
          ptx::cp_async_mbarrier_arrive_noinc(v_full(stage));
        } else {
          const TileBox box = tile_box(n0, kv_row0, kv_batch, pages);
          // One arrival per barrier phase and thread; lane 0's expects the bytes of the boxes
          // this warp issues (with shared barriers and V here, both tiles'). The warp's
          // arrivals all come before its copies, so every copy's bytes count against a phase
          // that expects them.
          constexpr uint32_t kKAndVBytes = Traits::kKBytes + Traits::kVBytes;
          if (issued >= kStages) ptx::mbarrier_wait(k_empty(stage), freed);
          if (lane == 0)
            ptx::mbarrier_arrive_expect_tx(
                k_full(stage), kSeparateKv || v_by_warp1 ? Traits::kKBytes : kKAndVBytes);
          else
            ptx::mbarrier_arrive(k_full(stage));
          __syncwarp(producer_lanes);
          load_boxes(box, kv_head, k_shared(stage), &p.k_map, std::integral_constant<int, kDimQK>{},
                     k_full(stage));
          if constexpr (kSeparateKv) {
            if (issued >= kStages) ptx::mbarrier_wait(v_empty(stage), freed);
            if (lane == 0 && !v_by_warp1)
              ptx::mbarrier_arrive_expect_tx(v_full(stage), Traits::kVBytes);
            else
              ptx::mbarrier_arrive(v_full(stage));
            __syncwarp(producer_lanes);
          }
          if (!v_by_warp1)
            load_boxes(box, kv_head, v_shared(stage), &p.v_map,
                       std::integral_constant<int, kDimV>{}, v_full(stage));
        }
      }
      w = next(w);
    }
    if (p.tma_tails) {
      ptx::cp_async_commit();  // leave no copy of this thread in flight at exit
      ptx::cp_async_wait<0>();
    }
    return;
  }
  if (warpgroup == 0) {
    // Producer with cp.async: each thread issues its copies of a stage and an arrive that
    // fires when they land; it waits only for a stage (or Q's buffer) to be freed.
    ptx::setmaxnreg_decrease<Traits::kProducerRegisters>();
    int round = 0, issued = 0;
#pragma unroll 1
    for (int w = blockIdx.x; w < work_count; w += gridDim.x) {
      FlashBlock<Element> b;
      if (!block_of(w, b) || b.n_block_end == b.n_block_begin) continue;
      const int q_buffer = round % kQBuffers;
      if (round >= kQBuffers) ptx::mbarrier_wait(q_empty(q_buffer), (round / kQBuffers - 1) & 1);
      ++round;
      produce_swizzled_tile<Element, kBlockM, kDimQK>(q_shared(q_buffer), b.q, p.q_row_stride,
                                                      b.rows_here);
      ptx::cp_async_mbarrier_arrive_noinc(q_full(q_buffer));
#pragma unroll 1
      for (int n_block = b.n_block_begin; n_block < b.n_block_end; ++n_block, ++issued) {
        const int stage = issued % kStages;
        const uint32_t freed = (issued / kStages - 1) & 1;
        const int n0 = n_block * kBlockN;
        const int* pages = p.block_table ? p.block_table + b.batch * p.block_table_stride : nullptr;
        if (issued >= kStages) ptx::mbarrier_wait(k_empty(stage), freed);
        if (pages) {
          produce_paged_tile<Element, kBlockN, kDimQK>(k_shared(stage), b.k, p.k_batch_stride,
                                                       p.k_row_stride, pages, p.page_shift, n0,
                                                       b.seqlen_kv - n0);
        } else {
          produce_swizzled_tile<Element, kBlockN, kDimQK>(k_shared(stage),
                                                          b.k + int64_t(n0) * p.k_row_stride,
                                                          p.k_row_stride, b.seqlen_kv - n0);
        }
        if constexpr (kSeparateKv) {
          ptx::cp_async_mbarrier_arrive_noinc(k_full(stage));
          if (issued >= kStages) ptx::mbarrier_wait(v_empty(stage), freed);
        }
        if (pages) {
          produce_paged_tile<Element, kBlockN, kDimV>(v_shared(stage), b.v, p.v_batch_stride,
                                                      p.v_row_stride, pages, p.page_shift, n0,
                                                      b.seqlen_kv - n0);
        } else {
          produce_swizzled_tile<Element, kBlockN, kDimV>(v_shared(stage),
                                                         b.v + int64_t(n0) * p.v_row_stride,
                                                         p.v_row_stride, b.seqlen_kv - n0);
        }
        ptx::cp_async_mbarrier_arrive_noinc(v_full(stage));
      }
    }
    ptx::cp_async_commit();  // leave no copy of this thread in flight at exit
    ptx::cp_async_wait<0>();
    return;
  }

  ptx::setmaxnreg_increase<Traits::kConsumerRegisters>();
  const int consumer = warpgroup - 1;  // rows consumer * 64 .. + 63 of the block
  const int warp_in_group = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  // Named barrier ids: the consumers take their turns at the tensor cores in a ring.
  const int my_turn = 1 + consumer, next_turn = 1 + (consumer + 1) % kConsumers;
  // Each turn barrier counts the waiting warpgroup and the one that hands it the turn.
  constexpr int kTurnThreads = 256;
  // At head dim 256 the consumers issue without turns: each GEMM is long enough that the other
  // consumer's softmax hides under it unordered, and the turns only add waits (session 50's
  // knock-out: the capped d256 row 1.03-1.07x without them, d64 and d128 0.94-0.98x; session
  // 51: every d256 row 1.01-1.04x).
  constexpr bool kTurns = kDimQK != 256;

  const ForwardDescriptors<Traits> descriptors(q_shared(0) + consumer * 64 * 128, k_shared(0),
                                               v_shared(0));
  // Waits until a stage's copies landed and makes them visible to this thread's wgmma
  // (cp.async writes through the generic proxy, wgmma reads through the async one; TMA
  // writes through the async proxy already).
  auto wait_landed = [&](uint32_t barrier, uint32_t parity, bool by_threads) {
    ptx::mbarrier_wait(barrier, parity);
    if (by_threads) ptx::fence_proxy_async_shared();
  };

  // Consumer 0 goes first: the last consumer hands it the first turn.
  if (kTurns && consumer == kConsumers - 1) ptx::named_barrier_arrive(1, kTurnThreads);
  int round = 0, issued = 0;
  // Dynamic scheduling: the producer names each block of work in the Q buffer's word; a block
  // without tiles frees the buffer at once, an index past the work ends the loop.
#pragma unroll 1
  for (int w = blockIdx.x;; w += gridDim.x) {
    if (dynamic) {
      const int q_buffer = round % kQBuffers;
      wait_landed(q_full(q_buffer), (round / kQBuffers) & 1, false);
      w = ptx::shared_load(block_id(q_buffer));
    }
    if (w >= work_count) break;
    FlashBlock<Element> b;
    const bool here = block_of(w, b);
    const int tiles = here ? b.n_block_end - b.n_block_begin : 0;
    if (dynamic && tiles == 0) {
      ptx::mbarrier_arrive(q_empty(round % kQBuffers));
      ++round;
    }
    if (!here) continue;
    // This warp's 16-row slab: rows of one head (with GQA packing, the slab's head of the
    // group, and the row its position), so the per-row code below stays per head.
    const int slab = consumer * 4 + warp_in_group;
    int row0 = b.m0 + slab * 16 + quad_row;
    if (p.packed_heads > 1) {
      const int slabs_per_head = block_positions / 16;
      b.head += slab / slabs_per_head;
      row0 = b.m0 + slab % slabs_per_head * 16 + quad_row;
      if (p.alibi_slopes)
        b.alibi_slope = p.alibi_slopes[b.batch * p.alibi_batch_stride + b.head] * kLog2e;
    }
    const float sink_log2 = block_sink_log2(p, b.head);
    // shift.fixed and scale_in_exp2 are constants in the plain and softcap kernels.
    const SoftmaxShift shift = kPlain             ? plain_softmax_shift(p)
                               : kSoftcapFixedMax ? softcap_fixed_softmax_shift(p, sink_log2)
                                                  : block_softmax_shift<Element>(p, sink_log2);
    RowStats stats = initial_row_stats(sink_log2, quad_col, shift);
    float o_acc[kVTiles][4];
#pragma unroll
    for (int t = 0; t < kVTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[t][e] = 0.f;

    if (tiles > 0) {
      const int q_buffer = round % kQBuffers;
      float correction[2];
      auto logits_to_probabilities = [&](float(&s_acc)[kNTiles][4], int n_block,
                                         const uint32_t(&keep)[2]) {
        const int n0 = n_block * kBlockN;
        const bool fully_visible = n0 >= b.last_row.begin && n0 + kBlockN <= b.first_row.end;
        if constexpr (kGeneral) {
          transform_logits<Element, kNTiles>(p, b, s_acc, row0, n0, quad_col, fully_visible,
                                             shift.shift, shift.scale_in_exp2);
        } else {
          // The plain kernel's scale goes into softmax_update's exp2 (scale_in_exp2).
          if constexpr (kSoftcapFixedMax) softcap_logits(p, s_acc, fully_visible, shift.shift);
          if (!fully_visible) mask_invisible_keys(p, b, s_acc, row0, n0, quad_col);
        }
        softmax_update(s_acc, stats, correction, shift);
        if constexpr (kGeneral) {
          if (p.dropout_threshold != 0) apply_dropout(p, s_acc, keep);
        }
      };
      uint32_t p_operand[kBlockN / 16][4];
      auto pack_probabilities = [&](const float(&s_acc)[kNTiles][4]) {
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) pack_p_operand<Element>(s_acc, kk, p_operand[kk]);
      };
      auto issue_qk = [&](float(&s_acc)[kNTiles][4], int stage) {
#pragma unroll
        for (int kk = 0; kk < kDimQK / 16; ++kk)
          ptx::wgmma_ss<Element, kBlockN>(s_acc, descriptors.q_at(q_buffer, kk),
                                          descriptors.k_at(stage, kk), kk > 0);
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
        if constexpr (kPowerOfTwoTile && kGeneral) {
          if (p.dropout_threshold != 0)
            draw_keep_bits<kNTiles>(p, b, row0, n_block * kBlockN, quad_col, keep);
        }
      };

      if (!dynamic) wait_landed(q_full(q_buffer), (round / kQBuffers) & 1, !p.tma);
      ++round;
      uint32_t keep[2];
      float s_acc[kNTiles][4];
      draw_keep(b.n_block_begin, keep);
      const bool first_by_threads = copied_by_threads(b.n_block_begin * kBlockN, b.seqlen_kv);
      wait_landed(k_full(issued % kStages), (issued / kStages) & 1, first_by_threads);
      if (kTurns) ptx::named_barrier_sync(my_turn, kTurnThreads);
      ptx::wgmma_fence();
      issue_qk(s_acc, issued % kStages);
      if (kTurns) ptx::named_barrier_arrive(next_turn, kTurnThreads);
      ptx::wgmma_wait<0>();
      ptx::fence_accumulators(s_acc);
      if constexpr (kSeparateKv) ptx::mbarrier_arrive(k_empty(issued % kStages));  // K(first) read
      if (tiles == 1) ptx::mbarrier_arrive(q_empty(q_buffer));  // the block's last read of Q
      logits_to_probabilities(s_acc, b.n_block_begin, keep);    // O is still zero: no rescale
      pack_probabilities(s_acc);

#pragma unroll 1
      for (int it = 1; it < tiles; ++it) {
        const int tile = issued + it;
        const int stage = tile % kStages, previous = (tile - 1) % kStages;
        const int n_block = b.n_block_begin + it;
        draw_keep(n_block, keep);
        wait_landed(k_full(stage), (tile / kStages) & 1,
                    copied_by_threads(n_block * kBlockN, b.seqlen_kv));
        if constexpr (kSeparateKv) {
          // V(n-1): landed long ago, but its barrier's completion is what makes it visible.
          wait_landed(v_full(previous), ((tile - 1) / kStages) & 1,
                      copied_by_threads((n_block - 1) * kBlockN, b.seqlen_kv));
        }
        if (kTurns) ptx::named_barrier_sync(my_turn, kTurnThreads);
        ptx::fence_accumulators(o_acc);
        ptx::wgmma_fence();
        issue_qk(s_acc, stage);
        issue_pv(previous);  // P(n-1) V(n-1)
        if (kTurns) ptx::named_barrier_arrive(next_turn, kTurnThreads);
        ptx::wgmma_wait<1>();  // S(n) is ready; P(n-1) V(n-1) may still run
        ptx::fence_accumulators(s_acc);
        if constexpr (kSeparateKv) ptx::mbarrier_arrive(k_empty(stage));  // K(n) is read
        if (it == tiles - 1) ptx::mbarrier_arrive(q_empty(q_buffer));
        logits_to_probabilities(s_acc, n_block, keep);
        ptx::wgmma_wait<0>();
        ptx::fence_accumulators(o_acc);
        ptx::fence_registers(p_operand);
        ptx::mbarrier_arrive(v_empty(previous));  // V(n-1) is read
        if (!shift.fixed) rescale_rows_if_moved(o_acc, correction);
        pack_probabilities(s_acc);
      }

      // O += P(last) V(last).
      const int last_tile = issued + tiles - 1, last = last_tile % kStages;
      if constexpr (kSeparateKv) {
        wait_landed(v_full(last), (last_tile / kStages) & 1,
                    copied_by_threads((b.n_block_end - 1) * kBlockN, b.seqlen_kv));
      }
      if (kTurns) ptx::named_barrier_sync(my_turn, kTurnThreads);
      ptx::fence_accumulators(o_acc);
      ptx::wgmma_fence();
      issue_pv(last);
      if (kTurns) ptx::named_barrier_arrive(next_turn, kTurnThreads);
      ptx::wgmma_wait<0>();
      ptx::fence_accumulators(o_acc);
      ptx::fence_registers(p_operand);
      ptx::mbarrier_arrive(v_empty(last));
      issued += tiles;
    }
    store_slab(p, b, o_acc, stats, row0, quad_col);
  }
  // Balances the last consumer's last arrive.
  if (kTurns && consumer == 0) ptx::named_barrier_sync(my_turn, kTurnThreads);
#else
  (void)p;  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace dpa::cuda
