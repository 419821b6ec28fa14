// The single-kernel wgmma backward (sm_90a, head dims 64 and 128): FlashAttention-2's five
// GEMMs per tile instead of the atomic-free pair's seven (flash_backward_sm90_ws.cuh), paid for
// with dq accumulated in an fp32 workspace through vector reductions (red.global.add.f32),
// whose order varies from run to run unless deterministic mode orders them (kDeterministic:
// key block by key block, through a flag per query tile). With dropout the producer warpgroup
// draws each query tile's
// keep bits into shared memory beside the tile's rows (draw_query_tile_keep_words), so the
// consumers pay one shared load per tile and two selects per element for it.
//
// A block owns 128 keys of one (batch, KV head), as the dk/dv kernel: a producer warpgroup
// copies K and V once and, per (query head, 64-row query tile), Q, dO and the rows' LSE and D
// into two stages; two consumer warpgroups of 64 keys each compute
//   S^T = K Q^T, dP^T = V dO^T                 (shared x shared, K-major)
//   P^T, dU^T = P^T (dP^T - D) (1 - t^2)        (registers)
//   dv += P^T dO                               (A from registers, dO MN-major)
// and write dU^T to shared memory (key-major, double-buffered but in d128's dropout form); after
// a barrier of both consumers, each computes its half of the head dim of dq_tile = dU K over all
// 128 keys (both operands MN-major), issues dk += dU^T Q (A from registers, Q MN-major) and,
// while dk runs, stores dq_tile to shared memory (fp32, in fragment order); at head dim 128 (two
// tiles) the producer warpgroup's thread 32 has the copy engine add it to the workspace (one bulk
// reduction per tile; deterministic mode's split producer does the same from warp 2's first
// thread, in key-block order), so the consumers issue no global reductions. Head dim 64 keeps one
// tile, which the producer's threads read and add (16-byte reductions), and its dropout form adds
// dq_tile from the consumers' registers instead (one_kernel_dq_from_registers); without dropout
// and outside deterministic mode each of its tiles takes a ticket
// (flash_backward_dq_takes_tickets): the first key block stores its partial, the later ones add to
// it once that store is published, and the workspace is never zeroed.
// launch_flash_backward_sm90_one_kernel then converts the workspace to dq (times scale).
#pragma once

#include <type_traits>

#include "cuda/flash/flash_backward_sm90_operands.cuh"
#include "cuda/ptx/gpu_flag.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/red.cuh"
#include "cuda/ptx/tma.cuh"

namespace dpa::cuda {

// The one-kernel backward's block: 128 keys, kBlockMT-row query tiles, a producer warpgroup and
// two consumers; kDuBuffers dU^T buffers of the block's 128 keys and kDqBuffers fp32 dq tiles in
// shared memory (OneKernelBackwardLayout). kDropout: the form with keep bits, whose words take
// the room of the second dU^T buffer at head dim 128.
// kBlockMT: the query tile, 64 rows or, where flash_backward_one_kernel_takes_128_rows, 128 (the
// launch takes flash_backward_plan's).
template <typename ElementT, int kHeadDimQKT, int kHeadDimVT, bool kDropoutT, int kBlockMT>
struct FlashBackwardSm90OneKernelTraits {
  using Element = ElementT;
  static constexpr bool kDropout = kDropoutT;
  static constexpr int kHeadDimQK = kHeadDimQKT, kHeadDimV = kHeadDimVT;
  static constexpr int kThreads = 384;  // producer warpgroup + two consumers
  static constexpr int kConsumerThreads = 256;
  static constexpr int kStages = 2;
  static constexpr int kBlockN = kOneKernelBackwardBlockN;
  static constexpr int kBlockM = kBlockMT;
  // 64-query swizzle blocks per query tile: the dU^T buffers' blocks (each kBlockN rows of 128
  // bytes), the dq products' halves and the workspace's 64-row tiles.
  static constexpr int kQueryBlocks = kBlockM / 64;
  static constexpr int kDuBuffers = flash_backward_one_kernel_du_buffers(kHeadDimQK, kDropout);
  static constexpr int kDuBytes = kDuBuffers * kBlockN * kBlockM * 2;
  // dq columns per consumer: half the head dim each (so neither holds its wgmmas in a branch,
  // which ptxas serialises).
  static constexpr int kDqColumns = kHeadDimQK / 2;
  static constexpr int kBarrierBytes = 128;
  // The dq tiles in shared memory (fp32), in fragment order as in the workspace
  // (dq_fragment_offset): kQueryBlocks 64-row tiles in a row, each consumer's half of one is
  // kDqHalf floats.
  static constexpr int kDqFloats = kBlockM * kHeadDimQK, kDqHalf = 64 * kHeadDimQK / 2;
  static constexpr int kDqBuffers = flash_backward_one_kernel_dq_buffers(kHeadDimQK);
  // Dropout keep bits per stage: one 32-bit word per consumer thread (draw_query_tile_keep_words).
  static constexpr int kKeepWords = kBlockN / 16 * 32;
  static constexpr int kKeepBytes = kDropout ? kStages * kKeepWords * 4 : 0;
  // K and V of the block, kStages of Q and dO and of the rows' LSE and D, the dU^T buffers, the
  // dq tiles, the keep words, barriers, 1 KB of alignment.
  static constexpr int kSharedBytes =
      2 * (kBlockN + kStages * kBlockM) * (kHeadDimQK + kHeadDimV) + kStages * 2 * kBlockM * 4 +
      kDuBytes + kDqBuffers * kDqFloats * 4 + kKeepBytes + kBarrierBytes + 1024;
  static_assert(flash_backward_one_kernel_narrow_eligible(kHeadDimQK, kHeadDimV),
                "head dims 64 or 128");
  static_assert(kBlockM == 64 ||
                    (kBlockM == 128 &&
                     flash_backward_one_kernel_takes_128_rows(kHeadDimQK, kHeadDimV, kDropout)),
                "64-row tiles, or 128 where the form takes them");
  static_assert(kDuBytes % 1024 == 0, "the statistics after the dU^T buffers stay aligned");
  static_assert(2 * kStages + 2 + 2 * kDqBuffers <= kBarrierBytes / 8, "mbarriers fit their slot");
  static_assert(kSharedBytes <= 227 * 1024, "tiles must fit sm_90 shared memory");
  static_assert(kSharedBytes == flash_backward_one_kernel_shared_bytes(kHeadDimQK, kHeadDimV,
                                                                       kDropout, kBlockM),
                "flash_tiles.h's size (the selector's rule) matches this layout");
  static_assert(kDqColumns == 32 || kDqColumns == 64,
                "a consumer's dq columns lie inside one 64-column swizzle block of K");
  static_assert(kKeepWords == kConsumerThreads, "one keep word per consumer thread and stage");
  static_assert(QueryTileRowStatistics<kBlockM>::kThreads == 128,
                "every producer thread arrives after its keep-word stores");
};

// Shared-memory addresses of a one-kernel backward block (FlashBackwardSm90OneKernelTraits):
// swizzled tiles as shared-window addresses, the rows' statistics and the dq tile as generic
// pointers.
template <typename Traits>
struct OneKernelBackwardLayout {
  static constexpr int kBlockN = Traits::kBlockN, kBlockM = Traits::kBlockM;
  static constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  static constexpr int kStages = Traits::kStages;
  uint32_t k, v, stages, du, barriers;
  float *lse, *delta, *dq;  // kStages x kBlockM, kStages x kBlockM, kDqBuffers tiles
  uint32_t* keep;           // kStages x Traits::kKeepWords, with dropout

  __device__ explicit OneKernelBackwardLayout(unsigned char* storage) {
    const uint32_t base = (ptx::shared_address(storage) + 1023u) & ~1023u;
    k = base;
    v = k + kBlockN * kDimQK * 2;
    stages = v + kBlockN * kDimV * 2;
    du = stages + kStages * kBlockM * (kDimQK + kDimV) * 2;
    const uint32_t statistics = du + Traits::kDuBytes;
    lse = reinterpret_cast<float*>(storage + (statistics - ptx::shared_address(storage)));
    delta = lse + kStages * kBlockM;
    dq = delta + kStages * kBlockM;
    keep = reinterpret_cast<uint32_t*>(dq + Traits::kDqBuffers * Traits::kDqFloats);
    barriers = statistics + kStages * 2 * kBlockM * 4 + Traits::kDqBuffers * Traits::kDqFloats * 4 +
               Traits::kKeepBytes;
  }
  __device__ uint32_t q(int stage) const { return stages + uint32_t(stage) * kBlockM * kDimQK * 2; }
  __device__ uint32_t d_o(int stage) const {
    return stages + kStages * kBlockM * kDimQK * 2 + uint32_t(stage) * kBlockM * kDimV * 2;
  }
  __device__ uint32_t full(int stage) const { return barriers + 8u * stage; }
  __device__ uint32_t empty(int stage) const { return barriers + 8u * (kStages + stage); }
  __device__ uint32_t kv() const { return barriers + 8u * (2 * kStages); }
  // dq tile `buffer` (iteration it's is it % kDqBuffers), stored by the consumers (full) and
  // added to the workspace by the producer (empty: read, the consumers may store the next).
  __device__ float* dq_tile(int buffer) const { return dq + buffer * Traits::kDqFloats; }
  __device__ uint32_t dq_full(int buffer) const { return kv() + 8u * (1 + buffer); }
  __device__ uint32_t dq_empty(int buffer) const {
    return kv() + 8u * (1 + Traits::kDqBuffers + buffer);
  }
  // With one dU^T buffer: both consumers' dq products have read it (256 arrivals per iteration).
  __device__ uint32_t du_empty() const { return kv() + 8u * (1 + 2 * Traits::kDqBuffers); }
};

// Thread 0 initialises the stage and key-block mbarriers of a one-kernel backward block, either
// form (`Layout` has full, empty and kv; the caller synchronises the block after). A stage is
// full after `full_arrivals` (query_tile_full_arrivals).
template <typename Traits, typename Layout>
__device__ __forceinline__ void init_key_block_barriers(const Layout& l, uint32_t full_arrivals) {
  if (threadIdx.x != 0) return;
  for (int s = 0; s < Traits::kStages; ++s) {
    ptx::mbarrier_init(l.full(s), full_arrivals);
    ptx::mbarrier_init(l.empty(s), Traits::kConsumerThreads);
  }
  ptx::mbarrier_init(l.kv(), 128);
}

// The producer warpgroup's first copies in a one-kernel backward block, either form: K and V,
// completing on l.kv(). Run by all 128 producer threads.
template <typename Traits, typename Layout>
__device__ __forceinline__ void produce_key_block_operands(const FlashBackwardParams& bp,
                                                           const KeyBlock& kb, const Layout& l) {
  if (bp.tma_query_tiles && threadIdx.x == 0) {
    ptx::prefetch_tensor_map(&bp.q_tile_map);
    ptx::prefetch_tensor_map(&bp.do_tile_map);
  }
  produce_key_block<typename Traits::Element, Traits::kBlockN, Traits::kHeadDimQK,
                    Traits::kHeadDimV>(bp.fwd, kb, l.k, l.v, l.kv());
}

// The producer's copies per iteration of a one-kernel backward block, either form (after
// produce_key_block_operands): Q, dO and the rows' LSE and D into the next free stage,
// `tile_extras(it, stage)` released with them, then `after_copies(it)`. Run by the first
// kLoaders producer threads (all 128, or 64 where the producer splits: then the query tiles
// come by TMA). kStatisticsAhead: each iteration's LSE and D are loaded one iteration ahead, so
// the load's latency is off the producer's path (+1-5%, session 16). Deterministic mode's
// 128-thread form loads them in their own iteration: a load still in flight delays the
// releasing store that hands a dq tile to the next key block (measured 10% slower). Leaves no
// copy of its threads in flight when it returns.
template <typename Traits, bool kStatisticsAhead, int kLoaders = 128, typename Layout,
          typename TileExtras, typename AfterCopies>
__device__ __forceinline__ void produce_key_block_iterations(const FlashBackwardParams& bp,
                                                             const KeyBlock& kb, const Layout& l,
                                                             TileExtras tile_extras,
                                                             AfterCopies after_copies) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kStages = Traits::kStages;
  using Statistics = QueryTileRowStatistics<kBlockM, kLoaders>;
  Statistics next_statistics{};
  if constexpr (kStatisticsAhead)
    next_statistics = query_tile_row_statistics<kBlockM, kLoaders>(bp, kb, 0);
#pragma unroll 1
  for (int it = 0; it < kb.iterations; ++it) {
    const int stage = it % kStages;
    Statistics statistics = next_statistics;
    if constexpr (kStatisticsAhead) {
      if (it + 1 < kb.iterations)
        next_statistics = query_tile_row_statistics<kBlockM, kLoaders>(bp, kb, it + 1);
    }
    if (it >= kStages) ptx::mbarrier_wait(l.empty(stage), (it / kStages - 1) & 1);
    if constexpr (!kStatisticsAhead)
      statistics = query_tile_row_statistics<kBlockM, kLoaders>(bp, kb, it);
    produce_query_tile<Element, kBlockM, Traits::kHeadDimQK, Traits::kHeadDimV>(
        bp, kb, it, l.q(stage), l.d_o(stage), l.lse + stage * kBlockM, l.delta + stage * kBlockM,
        statistics, l.full(stage), [&] { tile_extras(it, stage); });
    after_copies(it);
  }
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
}

// Dropout keep bits of iteration it's 64 queries against the block's kBlockN keys (DESIGN.md §5,
// at global positions), drawn by the producer warpgroup into kBlockN / 16 x 8 x 4 words: word
// (g, r, q) is the S^T fragment of the consumer thread with quad row r and quad column q in the
// warp that owns keys 16 g .. 16 g + 15, bit 4 t + e kept for its element s[t][e] (key
// 16 g + r + 8 (e / 2), query 8 t + 2 q + (e & 1)), so that thread reads its bits with one load.
// Producer thread (g, q, part) draws tiles t = 2 part and 2 part + 1: eight Philox blocks (one
// per query and 8-key half), byte `part` of each of its eight words.
template <int kBlockN, int kDrawsPerStep = 2>
__device__ __forceinline__ void draw_query_tile_keep_words(const FlashForwardParams& p,
                                                           const KeyBlock& kb, int it,
                                                           uint32_t* words) {
  static_assert(kBlockN / 16 * 16 <= 128, "one producer thread per (key group, quad column, part)");
  static_assert(8 % kDrawsPerStep == 0, "whole steps of a thread's eight draws");
  const int thread = int(threadIdx.x);
  if (thread >= kBlockN / 16 * 16) return;
  const int group = thread / 16, quad_col = (thread / 4) % 4, part = thread % 4;
  // dropout_block's counter words, in 32 bits (it keeps the low 32 bits of each).
  const uint32_t head = uint32_t(kb.head(it) + p.head_offset + p.heads_total * kb.batch);
  const uint32_t row0 =
      uint32_t(kb.first_query(it) + 2 * quad_col + 16 * part) + uint32_t(p.q_position[kb.batch]);
  const uint32_t key_block0 =
      uint32_t((kb.j0 + 16 * group + int64_t(p.kv_position[kb.batch])) >> 3);
  // Byte r % 4 of bytes[r / 4] is byte `part` of word (group, r, quad_col). The draws run in
  // order, each shifting the bytes down by one and setting their bit 7 (dropout_keep_byte_msbs:
  // the keep rule for two draws in four operations, one permutation for four), so that draw e
  // ends at bit e without unrolling the whole loop (the producer has 40 registers); no bit
  // crosses into the next byte, since the first draw's is shifted seven times. kDrawsPerStep
  // draws per loop step, whose rounds interleave: each is a chain of ten dependent multiplies
  // (two chains instead of one: the dropout rows 1.02-1.03x; four at d128 another 1.04x, at d64
  // 0.98x: docs/perf.md, session 43; one in the wide form, where two read 0.97-1.00x and
  // spilled more). The round keys come from the kernel's parameters (constant operands).
  const DropoutPairRule rule = dropout_pair_rule(p.dropout_threshold);
  uint32_t bytes[2] = {0u, 0u};
#pragma unroll 1
  for (int step = 0; step < 8 / kDrawsPerStep; ++step) {
    Philox4 blocks[kDrawsPerStep];
#pragma unroll
    for (int e = 0; e < kDrawsPerStep; ++e) {
      const int element = step * kDrawsPerStep + e;  // bit 4 tt + 2 half + c
      blocks[e] = philox4x32_10(
          {{key_block0 + uint32_t(element / 2 % 2),
            row0 + uint32_t(8 * (element / 4) + element % 2), head, uint32_t(p.offset)}},
          p.dropout_round_keys);
    }
#pragma unroll
    for (int e = 0; e < kDrawsPerStep; ++e) {
#pragma unroll
      for (int half = 0; half < 2; ++half)
        bytes[half] =
            (dropout_keep_byte_msbs(blocks[e], half, rule) & 0x80808080u) | (bytes[half] >> 1);
    }
  }
  unsigned char* out = reinterpret_cast<unsigned char*>(words + group * 32 + quad_col) + part;
#pragma unroll
  for (int r = 0; r < 8; ++r)
    out[16 * r] = static_cast<unsigned char>(bytes[r / 4] >> (8 * (r % 4)));
}

// Whether the consumers add their dq fragments to the workspace themselves, from registers
// (add_dq_fragments_in_order), rather than storing the tile to shared memory for the producer to
// add: only in head dim 64's dropout form, whose producer's Philox draws delayed the adds (1.11x at
// d64 with dropout, 1.08x on the gpt-oss window of 1024; docs/perf.md, session 39). Elsewhere
// the consumers' own reductions cost them more than the hand-off: d128 0.81x and d64 0.89x
// without dropout, d128 causal softcap with dropout 0.93x. Deterministic mode orders a whole
// tile by one producer thread.
constexpr bool one_kernel_dq_from_registers(int head_dim_qk, bool dropout, bool deterministic) {
  return head_dim_qk == 64 && dropout && !deterministic;
}

// Whether producer thread 32 alone has the copy engine add each dq tile to the workspace (one
// bulk reduction per tile, its buffer freed once the engine has read it, an iteration later),
// rather than the producer's 128 threads reading the tile and adding it: where two tiles
// alternate (flash_backward_one_kernel_dq_buffers), outside deterministic mode. There each
// tile's sums had to land before the tile was handed to the next key block, so the engine's
// latency stalled the hand-off (0.88-0.93x at d128, docs/perf.md, session 40).
template <typename Traits, bool kDeterministic>
constexpr bool one_kernel_dq_by_bulk_reduction() {
  return Traits::kDqBuffers == 2 && !kDeterministic;
}

// Whether deterministic mode's producer splits (FlashAttention-3's form): warps 0-1 issue the
// copies and store the rows' statistics (loaded an iteration ahead, two per thread), and warp
// 2's first thread adds the dq tiles in key-block order in a loop of its own, each with one
// bulk reduction by the copy engine, so a block that waits for its predecessor's hand-off stops
// only its dq adds, never its next copies (the 128-thread form waits with all four warps:
// 1.21-1.25x the default time at d128; warps 2-3's 16-byte reductions in place of the bulk one
// 1.11-1.14x slower than it, docs/perf.md sessions 42 and 44). Only where TMA copies the query
// tiles (one thread issues them), at 64-row tiles, without dropout (whose keep bits take all 128
// threads).
template <typename Traits, bool kDropout, bool kDeterministic>
constexpr bool one_kernel_producer_can_split() {
  return kDeterministic && !kDropout && Traits::kBlockM == 64;
}
template <typename Traits, bool kDropout, bool kDeterministic>
__device__ __forceinline__ bool one_kernel_producer_splits(const FlashBackwardParams& bp) {
  return one_kernel_producer_can_split<Traits, kDropout, kDeterministic>() && bp.tma_query_tiles;
}
constexpr int kSplitProducerLoaders = 64;  // warps 0-1
constexpr int kSplitProducerAdder = 64;    // warp 2's first thread

// The producer warpgroup of a narrow one-kernel backward block: produce_key_block_iterations
// and, once the consumers have stored iteration j's dq tile, the tile added to the workspace
// (both in fragment order): by one bulk reduction of the copy engine where
// one_kernel_dq_by_bulk_reduction, else by the producer threads' 16-byte reductions, by neither
// where the consumers add it themselves (one_kernel_dq_from_registers). The
// consumers store iteration it - kStages's dq tile just before releasing its stage, so that tile is
// added right after iteration it's copies are issued, and, with dropout, before iteration it's keep
// bits are drawn (the consumers wait for that tile to be read before they store the next).
// kDeterministic: each tile is added in key-block order (kDeterministicKeyChain): one thread
// waits until the tile's flag names this block, when the previous key block adds to the tile
// too, and after every adding thread's reductions (a barrier) hands the tile on with a
// releasing store. Where the producer splits (one_kernel_producer_splits), one thread adds every
// tile as soon as it is stored, by one bulk reduction whose sums it waits for before the
// releasing store (add_dq_tile_in_order); else all 128 threads add it after the copies as above,
// and the waiting thread is warp 1's first: the releasing store stalls its warp until the
// reductions have landed, and warp 0's thread 0 issues the TMA copies, which should not wait for
// that.
template <typename Traits, bool kDropout, bool kDeterministic>
__device__ __forceinline__ void run_one_kernel_backward_producer(
    const FlashBackwardParams& bp, const KeyBlock& kb, const OneKernelBackwardLayout<Traits>& l) {
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kDimQK = Traits::kHeadDimQK;
  constexpr int kStages = Traits::kStages;
  constexpr int kProducerBarrier = 2;  // the consumers use named barrier 1
  // Where all 128 threads add: the bulk reductions' thread and deterministic mode's hand-offs.
  constexpr int kAllAddHandOffThread = 32;
  const FlashForwardParams& p = bp.fwd;
  const int key_block = kb.j0 / kBlockN;
  // The query tiles the previous key block adds to (empty for the first).
  const QueryTileSpan previous =
      key_block_query_tiles(kb.j0 - kBlockN, kBlockN, kBlockM, kb.seqlen_q, kb.seqlen_kv,
                            kb.diagonal, p.window_left, p.window_right);
  constexpr int kBuffers = Traits::kDqBuffers;
  constexpr bool kBulk = one_kernel_dq_by_bulk_reduction<Traits, kDeterministic>();
  // The tile's flag in deterministic mode: the key block whose turn it is to add query tile
  // `tile` of head `head`.
  auto dq_order_flag = [&](int head, int tile) {
    return bp.dq_order + (int64_t(kb.batch) * p.heads_q + head) * bp.dq_tiles_per_head + tile;
  };
  // Outside deterministic mode, where flash_backward_dq_takes_tickets: each tile's ticket word
  // (dq_ticket_word; the launch checks that the host allotted them).
  constexpr bool kTickets =
      flash_backward_dq_takes_tickets(kDimQK, Traits::kHeadDimV, kDropout, kDeterministic, kBlockM);
  static_assert(!kTickets || (!kBulk && !kDropout), "tickets where the producer's threads add");
  auto dq_ticket = [&](int head, int i0) { return dq_ticket_word(bp, kb.batch, head, i0); };
  // All 128 producer threads add each tile; kHandOffThread issues the bulk reductions and
  // deterministic mode's hand-offs.
  auto add_dq_tile = [&](int j) {
    constexpr int kAdders = 128;
    [[maybe_unused]] constexpr int kHandOffThread = kAllAddHandOffThread;
    const int buffer = j % kBuffers, head = kb.head(j), i0 = kb.first_query(j);
    // The tile and its workspace range are both in fragment order, rows past the sequence
    // included (the workspace rounds them up).
    float* accum_tile = bp.dq_accum + dq_workspace_row(p, kb.batch, head, i0) * kDimQK;
    if constexpr (kBulk) {
      if (threadIdx.x != kHandOffThread) return;
      ptx::mbarrier_wait(l.dq_full(buffer), (j / kBuffers) & 1);
      ptx::bulk_reduce_add_f32(accum_tile, ptx::shared_address(l.dq_tile(buffer)),
                               Traits::kDqFloats * 4);
      ptx::bulk_commit_group();
      ptx::bulk_wait_group_read<1>();  // tile j - 1 is read: its buffer is free
      if (j > 0) ptx::mbarrier_arrive(l.dq_empty((j - 1) % kBuffers));
    } else {
      [[maybe_unused]] int* order = nullptr;
      [[maybe_unused]] bool waits_for_previous = false;
      if constexpr (kDeterministic) {
        const int tile = i0 / kBlockM;
        order = dq_order_flag(head, tile);
        waits_for_previous = previous.first <= tile && tile <= previous.last;
      }
      [[maybe_unused]] int ticket = 0;
      if constexpr (kTickets) {
        // Taken before the wait for the tile, which hides the atomic's round trip; a block that
        // holds ticket 0 waits for nothing but its own consumers before it stores, so the later
        // ones' waits below always end.
        if (threadIdx.x == kHandOffThread)
          ticket = atomicAdd(dq_ticket(head, i0), 1) & kDqTicketCount;
      }
      ptx::mbarrier_wait(l.dq_full(buffer), (j / kBuffers) & 1);
      // Whether this block stores the tile (ticket 0) rather than adding to the first's partial.
      [[maybe_unused]] bool stores = false;
      if constexpr (kTickets) {
        if (threadIdx.x == kHandOffThread && ticket != 0)
          while ((ptx::load_acquire_gpu(dq_ticket(head, i0)) & kDqTicketStored) == 0) {
          }
        __syncwarp();  // thread 32's warp whole again before the aligned barrier
        stores = ptx::named_barrier_sync_or(kProducerBarrier, kAdders,
                                            threadIdx.x == kHandOffThread && ticket == 0);
      }
      if constexpr (kDeterministic) {
        if (threadIdx.x == kHandOffThread && waits_for_previous)
          while (ptx::load_acquire_gpu(order) != key_block) {
          }
        ptx::named_barrier_sync(kProducerBarrier, kAdders);
      }
      // A float4 per thread and pass, in order.
      constexpr int kPasses = Traits::kDqFloats / 4 / kAdders;
      const int adder = int(threadIdx.x);
      const float4* tile = reinterpret_cast<const float4*>(l.dq_tile(buffer)) + adder;
      float4* accum = reinterpret_cast<float4*>(accum_tile) + adder;
      if constexpr (kDropout) {
        // One pass at a time: this form's producer registers hold the Philox draws' context.
#pragma unroll 1
        for (int pass = 0; pass < kPasses; ++pass)
          ptx::red_add_v4(accum + pass * kAdders, tile[pass * kAdders]);
      } else {
        // The shared loads of kLoadsInFlight passes issued before their reductions (one at a
        // time, the loop waited out each load's latency while the consumers waited for the tile
        // to be freed: session 16's profile). Two at 128-row tiles, whose producer keeps 24
        // registers.
        constexpr int kLoadsInFlight = kBlockM == 128 ? 2 : 4;
        static_assert(kPasses % kLoadsInFlight == 0, "whole batches of passes");
#pragma unroll 1
        for (int pass = 0; pass < kPasses; pass += kLoadsInFlight) {
          float4 sums[kLoadsInFlight];
#pragma unroll
          for (int k = 0; k < kLoadsInFlight; ++k) sums[k] = tile[(pass + k) * kAdders];
#pragma unroll
          for (int k = 0; k < kLoadsInFlight; ++k)
            ptx::store_or_add_v4(accum + (pass + k) * kAdders, sums[k], stores);
        }
      }
      ptx::mbarrier_arrive(l.dq_empty(buffer));  // the tile is read
      if constexpr (kTickets) {
        if (stores) {
          // Every adder's stores made, then published at GPU scope (as a grid barrier does).
          ptx::named_barrier_sync(kProducerBarrier, kAdders);
          if (threadIdx.x == kHandOffThread) {
            __threadfence();
            atomicOr(dq_ticket(head, i0), kDqTicketStored);
          }
        }
      }
      if constexpr (kDeterministic) {
        ptx::named_barrier_sync(kProducerBarrier, kAdders);  // every adder's reductions issued
        if (threadIdx.x == kHandOffThread) ptx::store_release_gpu(order, key_block + 1);
      }
    }
  };
  // The split producer's adder: tile j by one bulk reduction once the previous key block's
  // sums are in (its flag); the buffer freed as soon as the engine has read it (dq_empty takes
  // this thread's one arrival), then, once the engine's sums are complete (wait_group 0, and the
  // async proxy's writes ordered before the generic release), the tile handed on.
  auto add_dq_tile_in_order = [&](int j) {
    const int buffer = j % kBuffers, head = kb.head(j), i0 = kb.first_query(j);
    const int tile = i0 / kBlockM;
    int* order = dq_order_flag(head, tile);
    ptx::mbarrier_wait(l.dq_full(buffer), (j / kBuffers) & 1);
    if (previous.first <= tile && tile <= previous.last) {
      while (ptx::load_acquire_gpu(order) != key_block) {
      }
      // The acquire orders generic-proxy accesses; the reduction below is the async proxy's.
      ptx::fence_proxy_async_global();
    }
    ptx::bulk_reduce_add_f32(bp.dq_accum + dq_workspace_row(p, kb.batch, head, i0) * kDimQK,
                             ptx::shared_address(l.dq_tile(buffer)), Traits::kDqFloats * 4);
    ptx::bulk_commit_group();
    ptx::bulk_wait_group_read<0>();
    ptx::mbarrier_arrive(l.dq_empty(buffer));
    ptx::bulk_wait_group<0>();
    ptx::fence_proxy_async_global();
    ptx::store_release_gpu(order, key_block + 1);
  };
  produce_key_block_operands<Traits>(bp, kb, l);
  if constexpr (one_kernel_producer_can_split<Traits, kDropout, kDeterministic>()) {
    if (one_kernel_producer_splits<Traits, kDropout, kDeterministic>(bp)) {
      if (threadIdx.x < kSplitProducerLoaders) {
        produce_key_block_iterations<Traits, true, kSplitProducerLoaders>(
            bp, kb, l, [](int, int) {}, [](int) {});
      } else {
        // This thread's K and V copies land before it exits (no thread leaves cp.async copies
        // in flight; warps 2-3 have nothing else to wait on) or starts adding.
        ptx::cp_async_commit();
        ptx::cp_async_wait<0>();
        if (threadIdx.x == kSplitProducerAdder) {
#pragma unroll 1
          for (int j = 0; j < kb.iterations; ++j) add_dq_tile_in_order(j);
        }
      }
      return;
    }
  }
  constexpr bool kAddsDq = !one_kernel_dq_from_registers(kDimQK, kDropout, kDeterministic);
  auto add_previous_dq_tile = [&](int it) {
    if constexpr (kAddsDq) {
      if (it >= kStages) add_dq_tile(it - kStages);
    }
  };
  if constexpr (kDropout) {
    auto add_and_draw = [&](int it, int stage) {
      add_previous_dq_tile(it);
      draw_query_tile_keep_words<Traits::kBlockN, kDimQK == 128 ? 4 : 2>(
          p, kb, it, l.keep + stage * Traits::kKeepWords);
    };
    produce_key_block_iterations<Traits, !kDeterministic>(bp, kb, l, add_and_draw, [](int) {});
  } else {
    produce_key_block_iterations<Traits, !kDeterministic>(
        bp, kb, l, [](int, int) {}, add_previous_dq_tile);
  }
  if constexpr (kAddsDq) {
#pragma unroll 1
    for (int j = max(0, kb.iterations - kStages); j < kb.iterations; ++j) add_dq_tile(j);
    // The engine reads the last tiles and makes their sums before the block's memory goes.
    if (kBulk && threadIdx.x == kAllAddHandOffThread) ptx::bulk_wait_group<0>();
  }
}

// Writes a warp's packed operands (dU^T or P^T: its 16 keys from `warp_row0`, kSteps * 16 query
// columns from 8 * first_chunk) into a 128-byte-swizzled key-major tile of 64 query columns.
// Operand word (kk, e) holds rows g + 8 (e & 1) of n8 tile 2 kk + e / 2, columns 2q and 2q + 1:
// matrix e of an stmatrix.x4, whose rows are 16-byte chunks of the tile, so a warp stores each
// step's 512 bytes with one instruction (four st.shared.b32 per thread and step before).
// More than 4 steps (first_chunk 0) fill tiles of 64 query columns in a row, `block_bytes` apart:
// steps 4 b .. 4 b + 3 go to tile b.
template <int kSteps>
__device__ __forceinline__ void store_key_major_operands(uint32_t tile,
                                                         const uint32_t (&a)[kSteps][4],
                                                         int warp_row0, int first_chunk = 0,
                                                         uint32_t block_bytes = 0) {
  static_assert(kSteps <= 4 || kSteps % 4 == 0, "whole tiles of 64 query columns");
  // This lane addresses row lane % 8 of matrix lane / 8.
  const int lane = int(threadIdx.x) % 32, matrix = lane / 8;
  const int row_in_block = lane % 8 + 8 * (matrix & 1);  // warp_row0 is a multiple of 16
  const uint32_t row = tile + uint32_t(warp_row0 + row_in_block) * 128;
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const int chunk = first_chunk + 2 * (kk % 4) + matrix / 2;
    ptx::stmatrix_x4(row + (kk / 4) * block_bytes + ((chunk ^ (lane % 8)) << 4), a[kk]);
  }
}

// Adds a consumer's dq fragments (iteration it's tile, its half of the columns) to the fp32
// workspace, whose tiles are in fragment order (dq_fragment_offset): one 16-byte reduction per
// n8 tile, a warp's 512 bytes in order, rows past the sequence included (the workspace rounds
// them up).
template <int kDimQK, int kN>
__device__ __forceinline__ void add_dq_fragments_in_order(const FlashBackwardParams& bp,
                                                          const KeyBlock& kb, int it,
                                                          const float (&dq_tile)[kN / 8][4],
                                                          int consumer) {
  const int i0 = kb.first_query(it);
  float4* accum = reinterpret_cast<float4*>(
                      bp.dq_accum + dq_workspace_row(bp.fwd, kb.batch, kb.head(it), i0) * kDimQK +
                      consumer * 32 * kDimQK) +
                  threadIdx.x % 128;
#pragma unroll
  for (int t = 0; t < kN / 8; ++t)
    ptx::red_add_v4(accum + t * 128,
                    make_float4(dq_tile[t][0], dq_tile[t][1], dq_tile[t][2], dq_tile[t][3]));
}

// kDropout: the form with keep bits (drawing them costs the producer registers, and its spills
// would slow every call; launched only when p.dropout_threshold != 0). kDeterministic: dq
// reductions in key-block order, the grid in key-block chains (bp.dq_order, bp.key_chain).
template <typename Traits, bool kDropout, bool kDeterministic>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_backward_one_kernel_sm90_kernel(const __grid_constant__ FlashBackwardParams bp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  const FlashForwardParams& p = bp.fwd;
  constexpr int kBlockN = Traits::kBlockN, kBlockM = Traits::kBlockM;
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  constexpr int kStages = Traits::kStages, kConsumerThreads = Traits::kConsumerThreads;
  constexpr int kMTiles = kBlockM / 8, kDqColumns = Traits::kDqColumns;
  constexpr int kQueryBlocks = Traits::kQueryBlocks;
  constexpr bool kDqFromRegisters = one_kernel_dq_from_registers(kDimQK, kDropout, kDeterministic);

  static_assert(Traits::kDropout == kDropout, "the traits' shared memory is the form's");
  extern __shared__ __align__(1024) unsigned char shared_storage[];
  const OneKernelBackwardLayout<Traits> l(shared_storage);
  constexpr int kDuBuffers = Traits::kDuBuffers;
  auto du_shared = [&](int buffer) { return l.du + uint32_t(buffer) * kBlockN * kBlockM * 2; };

  KeyBlock kb;
  if constexpr (kDeterministic) {
    const KeyBlockCoordinates c =
        deterministic_key_block(int(blockIdx.x), int(blockIdx.z), p.batch, bp.key_chain);
    if (!make_key_block(p, kBlockN, kBlockM, kb, c.batch, int(blockIdx.y), c.key_block)) return;
    // Last tile first: a causal or windowed block's tiles end one key block's worth of rows
    // after its predecessor's, so walking down, neighbours reach a shared tile at about the same
    // step (walking up, each block would trail its predecessor by two tiles per link).
    kb.descending = true;
  } else if (!make_key_block(p, kBlockN, kBlockM, kb)) {
    return;
  }
  const bool producer_splits = one_kernel_producer_splits<Traits, kDropout, kDeterministic>(bp);
  // Whether the copy engine adds the dq tiles (thread 32's bulk reductions, or the split
  // producer's adder): the consumers then fence each tile for the async proxy, and one producer
  // thread waits for the engine's reads.
  const bool dq_by_copy_engine =
      one_kernel_dq_by_bulk_reduction<Traits, kDeterministic>() || producer_splits;
  init_key_block_barriers<Traits>(
      l, producer_splits ? query_tile_full_arrivals<kBlockM, kSplitProducerLoaders>(bp)
                         : query_tile_full_arrivals<kBlockM>(bp));
  if (!kDqFromRegisters && threadIdx.x == 0) {
    for (int buffer = 0; buffer < Traits::kDqBuffers; ++buffer) {
      ptx::mbarrier_init(l.dq_full(buffer), Traits::kConsumerThreads);
      ptx::mbarrier_init(l.dq_empty(buffer), dq_by_copy_engine ? 1 : 128);
    }
  }
  if (kDuBuffers == 1 && threadIdx.x == 0) ptx::mbarrier_init(l.du_empty(), kConsumerThreads);
  __syncthreads();

  // Broadcast from lane 0 at head dim 64, as in the forward, so that ptxas knows it is
  // warp-uniform and builds the consumers' wgmma descriptors in uniform registers (SASS,
  // session 25: the d64 consumer loop loses its 32 R2UR, 1799 -> 1743 instructions, no
  // spills). Not at d128, where ptxas then spilled 128 bytes (none without).
  const int warpgroup =
      kDimQK == 64 ? __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0) : int(threadIdx.x / 128);
  if (warpgroup == 0) {
    // At 128-row tiles the consumers' S^T and dP^T take 64 registers each: 240 for them and 24
    // for the producer (FlashAttention-3's split) spill 80 bytes where 232 / 40 spilled 108,
    // and put 9 local loads in the consumer loop instead of 23 (sm_90a, bf16).
    ptx::setmaxnreg_decrease<kBlockM == 128 ? 24 : 40>();
    if (kb.iterations > 0)
      run_one_kernel_backward_producer<Traits, kDropout, kDeterministic>(bp, kb, l);
    return;
  }

  ptx::setmaxnreg_increase<kBlockM == 128 ? 240 : 232>();
  const int consumer = warpgroup - 1;
  const int warp_in_group = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int key_row = consumer * 64 + warp_in_group * 16 + quad_row;  // in the block
  const int key0 = kb.j0 + key_row;
  // dq columns of this consumer (none for the second one with head dim 64).
  // This consumer's dq columns of K: whole 64-column blocks (head dim 128), or half of the one
  // block (head dim 64: 64 bytes into each 128-byte row; the swizzle applies to the address).
  const int dq_column0 = consumer * kDqColumns;
  const uint32_t k_columns =
      l.k + uint32_t((dq_column0 / 64) * kBlockN * 128 + (dq_column0 % 64) * 2);

  float dk_acc[kDimQK / 8][4], dv_acc[kDimV / 8][4];
  zero_fragments(dk_acc);
  zero_fragments(dv_acc);
  if (kb.iterations > 0) {
    // dq_tile[b]: this consumer's dq columns of the tile's query rows 64 b .. 64 b + 63.
    float s[kMTiles][4], dp[kMTiles][4], dq_tile[kQueryBlocks][kDqColumns / 8][4];
    uint32_t derivative[kMTiles][2];
    uint32_t pd_operand[kBlockM / 16][4], du_operand[kBlockM / 16][4];

    ptx::mbarrier_wait(l.kv(), 0);
    ptx::fence_proxy_async_shared();
#pragma unroll 1
    for (int it = 0; it < kb.iterations; ++it) {
      const int stage = it % kStages, buffer = it % kDuBuffers;
      ptx::mbarrier_wait(l.full(stage), (it / kStages) & 1);
      // cp.async wrote Q and dO through the generic proxy; TMA writes through the async one.
      if (!bp.tma_query_tiles) ptx::fence_proxy_async_shared();

      // S^T = K Q^T and dP^T = V dO^T (two groups: P^T is computed while dP^T runs).
      ptx::wgmma_fence();
      wgmma_rows_by_rows<Element, kBlockM, kDimQK>(s, l.k, kBlockN, consumer * 64, l.q(stage));
      ptx::wgmma_commit();
      wgmma_rows_by_rows<Element, kBlockM, kDimV>(dp, l.v, kBlockN, consumer * 64, l.d_o(stage));
      ptx::wgmma_commit();

      const KeyTile key_tile = key_tile_of(p, kb, it);
      const int i0 = kb.first_query(it), warp_key0 = key0 - quad_row;
      const bool fully_visible =
          tile_fully_visible(p, key_tile, i0, i0 + kBlockM - 1, warp_key0, warp_key0 + 15);
      // This thread's keep bits (its word: consumer warp index x 32 + lane).
      const uint32_t keep =
          kDropout ? l.keep[stage * Traits::kKeepWords + (threadIdx.x - 128)] : 0u;
      ptx::wgmma_wait<1>();
      ptx::fence_accumulators(s);
      key_tile_probabilities_no_dropout(p, key_tile, s, derivative, key0, i0, quad_col,
                                        l.lse + stage * kBlockM, fully_visible);
      // dv += P^T dO is issued as soon as its operand is known, so that it runs under the
      // arithmetic that follows: here at head dim 64 without dropout, else after dU^T (Pd^T
      // needs the keep bits that key_tile_gradients applies; at head dim 128, P^T's operand
      // held beside S^T and dP^T spilled and serialised the wgmmas, ptxas C7512).
      constexpr bool kEarlyDv = !kDropout && kDimV == 64 && kBlockM == 64;
      auto issue_dv = [&] {
        pack_operands<Element>(s, pd_operand);
        ptx::fence_accumulators(dv_acc);
        ptx::wgmma_fence();
        wgmma_fragments_by_rows<Element, kDimV, kBlockM>(dv_acc, pd_operand, l.d_o(stage));
        ptx::wgmma_commit();
      };
      if constexpr (kEarlyDv) {
        issue_dv();
        ptx::wgmma_wait<1>();  // dP^T has landed; dv may still run
      } else {
        ptx::wgmma_wait<0>();
      }
      ptx::fence_accumulators(dp);
      // dU^T; with dropout s becomes Pd^T but for 1 / keep_prob (dv is scaled at the end).
      key_tile_gradients<kDropout>(p, s, dp, derivative, quad_col, l.delta + stage * kBlockM, keep,
                                   kDropout ? p.dropout_scale : 1.f);
      if constexpr (!kEarlyDv) issue_dv();
      pack_operands<Element>(dp, du_operand);

      // dU^T of both consumers into shared memory. With two buffers, this one's previous reader
      // (iteration it - 2's dq) finished before the previous iteration's barrier; with one, both
      // consumers' dq products of iteration it - 1 must have finished.
      if (kDuBuffers == 1 && it > 0) ptx::mbarrier_wait(l.du_empty(), (it - 1) & 1);
      store_key_major_operands(du_shared(buffer), du_operand, key_row - quad_row, 0, kBlockN * 128);
      ptx::fence_proxy_async_shared();
      ptx::named_barrier_sync(1, kConsumerThreads);

      // dq_tile = dU K over the block's 128 keys, this consumer's dq columns, then dk += dU^T Q,
      // so that dk runs while the dq tile is stored (or added).
      ptx::fence_accumulators(dk_acc);
      ptx::wgmma_fence();
#pragma unroll
      for (int b = 0; b < kQueryBlocks; ++b)
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk)
          ptx::wgmma_ss_mn_major<Element, kDqColumns>(
              dq_tile[b], mn_major_descriptor(du_shared(buffer) + b * kBlockN * 128, kBlockN, kk),
              mn_major_descriptor(k_columns, kBlockN, kk), kk > 0);
      ptx::wgmma_commit();
      wgmma_fragments_by_rows<Element, kDimQK, kBlockM>(dk_acc, du_operand, l.q(stage));
      ptx::wgmma_commit();
      ptx::wgmma_wait<1>();  // dv and dq are done; dk may still run
      if constexpr (kDuBuffers == 1) ptx::mbarrier_arrive(l.du_empty());  // dU^T is read
      ptx::fence_accumulators(dv_acc);
#pragma unroll
      for (int b = 0; b < kQueryBlocks; ++b) ptx::fence_accumulators(dq_tile[b]);
      ptx::fence_registers(pd_operand);
      if constexpr (kDqFromRegisters) {
        static_assert(kQueryBlocks == 1, "the dropout form's 64-row tiles");
        add_dq_fragments_in_order<kDimQK, kDqColumns>(bp, kb, it, dq_tile[0], consumer);
      } else {
        // The tile this buffer held (kDqBuffers iterations back) is read. Stored in fragment
        // order (dq_fragment_offset): a warp's float4 stores fill 512 bytes in order.
        constexpr int kBuffers = Traits::kDqBuffers;
        const int dq_buffer = it % kBuffers;
        if (it >= kBuffers) ptx::mbarrier_wait(l.dq_empty(dq_buffer), (it / kBuffers - 1) & 1);
        // A 32-bit shared address: a generic pointer's two registers spilled the dropout form.
        const uint32_t half =
            ptx::shared_address(l.dq_tile(dq_buffer) + consumer * Traits::kDqHalf) +
            (threadIdx.x % 128) * 16;
#pragma unroll
        for (int b = 0; b < kQueryBlocks; ++b)
#pragma unroll
          for (int t = 0; t < kDqColumns / 8; ++t)
            asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                             half + b * (64 * kDimQK * 4) + t * 2048),
                         "f"(dq_tile[b][t][0]), "f"(dq_tile[b][t][1]), "f"(dq_tile[b][t][2]),
                         "f"(dq_tile[b][t][3])
                         : "memory");
        if (dq_by_copy_engine) ptx::fence_proxy_async_shared();
        ptx::mbarrier_arrive(l.dq_full(dq_buffer));  // release: the tile above is visible
      }

      ptx::wgmma_wait<0>();
      ptx::fence_accumulators(dk_acc);
      ptx::fence_registers(du_operand);
      ptx::mbarrier_arrive(l.empty(stage));  // Q, dO, LSE, D of this iteration are read
    }
  }

  if constexpr (kDropout) {  // dv = Pd^T dO, Pd = P keep / keep_prob
#pragma unroll
    for (int t = 0; t < kDimV / 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) dv_acc[t][e] *= p.dropout_scale;
  }
  store_key_block_gradients<Element, kDimQK, kDimV>(bp, kb, dk_acc, dv_acc, key0, quad_col);
#else
  (void)bp;  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace dpa::cuda
