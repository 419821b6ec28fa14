// Host-side tile shapes and launch heuristics of the flash forward kernels. Pure functions
// with unit tests (tests/cuda/test_flash_tiles.cc); the kernel traits use the same shape function,
// so host decisions and compiled tiles cannot disagree.
#pragma once

#include <cstdint>

#include "dpa/types.h"

namespace dpa::cuda {

struct FlashTileShape {
  int block_m = 0;  // query rows per block: 16 * warps * slabs
  int block_n = 0;  // keys per KV tile
  int warps = 0;
  int slabs = 0;  // 16-row slabs per warp
  int shared_bytes = 0;
  int blocks_per_sm = 0;  // expected resident blocks per SM (for split-KV sizing)
  bool wgmma = false;     // the sm_90a warpgroup kernel (flash_forward_sm90_ws.cuh)
  // Its producer / ping-pong form: every wgmma plan's since the plain two-warpgroup form went
  // (session 32); flash_forward_wgmma_tile_shape is that form's tile, on which
  // flash_forward_wgmma_ws_tile_shape builds.
  bool warp_specialized = false;
  // Query heads of one KV head packed into a block (flash_forward_packs_gqa); 1: none.
  int packed_heads = 1;
};

// Decode-like problems (at most this many query rows) use one-warp blocks of 16 rows so that
// a 128-row tile is not spent on one query.
constexpr int kFlashDecodeMaxQueries = 16;

// Q, K and V tiles with rows padded by 8 elements (16 bytes).
constexpr int flash_forward_shared_bytes(int block_m, int block_n, int head_dim_qk,
                                         int head_dim_v) {
  return 2 *
         (block_m * (head_dim_qk + 8) + block_n * (head_dim_qk + 8) + block_n * (head_dim_v + 8));
}

// The sm_90a warpgroup kernels (flash_forward_sm90_ws.cuh): consumer warpgroups of 64 rows, K and
// V in 128-byte-swizzled shared memory (blocks of 64 columns, so head dims must be multiples of
// 64).
constexpr bool flash_forward_wgmma_eligible(int head_dim_qk, int head_dim_v) {
  return head_dim_qk % 64 == 0 && head_dim_v % 64 == 0 && head_dim_qk <= 256 && head_dim_v <= 256;
}

// The wgmma base tile: two consumer warpgroups, two stages of K and V. The warp-specialised
// shape (flash_forward_wgmma_ws_tile_shape) builds on it.
constexpr FlashTileShape flash_forward_wgmma_tile_shape(int head_dim_qk, int head_dim_v) {
  FlashTileShape shape;
  shape.wgmma = true;
  shape.warps = 8;
  shape.slabs = 1;
  shape.block_m = 128;
  // 128 keys per tile while S (64 fp32 per thread) and O fit the register file together;
  // wider heads take 64 keys (O alone is 128 fp32 per thread at dv = 256).
  shape.block_n = (head_dim_qk <= 128 && head_dim_v <= 128) ? 128 : 64;
  constexpr int kStages = 2;
  // Q, two stages of K and V, and 1 KB to align the base to the swizzle pattern.
  shape.shared_bytes =
      2 * (shape.block_m * head_dim_qk + kStages * shape.block_n * (head_dim_qk + head_dim_v)) +
      1024;
  shape.blocks_per_sm = 1;
  return shape;
}

// The warp-specialised forward's mbarriers: K and V of each stage full and empty (up to three
// stages), each Q buffer's full and empty (up to two); then the block of work each Q buffer
// holds (dynamic scheduling, FlashForwardParams::tile_counter): the region after the tiles.
constexpr int kFlashWsMbarrierBytes = 128;
constexpr int kFlashWsBlockIdBytes = 16;
constexpr int kFlashWsBarrierBytes = kFlashWsMbarrierBytes + kFlashWsBlockIdBytes;

// The warp-specialised form of the sm_90a kernel: a producer warpgroup and consumer warpgroups
// of 64 rows each, the same key tile; K and V of a tile share a stage, three stages where they
// fit in the 227 KB of shared memory, else two.
constexpr int flash_forward_wgmma_ws_stages(int head_dim_qk, int head_dim_v, int block_m,
                                            int block_n) {
  const int q_bytes = 2 * block_m * head_dim_qk,
            stage_bytes = 2 * block_n * (head_dim_qk + head_dim_v);
  constexpr int kAlignAndBarriers = 1024 + kFlashWsBarrierBytes;
  return q_bytes + 3 * stage_bytes + kAlignAndBarriers <= 227 * 1024 ? 3 : 2;
}

// Q buffers of the warp-specialised form: one. The ring of Q buffers (flash_forward_sm90_ws.cuh)
// takes any count, so that the producer may load the next block's Q while the consumers still
// read this one's. One buffer read 1.00-1.09x the speed of two (where two fit) on every row of
// bench/rows_q_buffers.txt in session 51 (docs/perf.md); two alone were mixed in session 50.
constexpr int kFlashForwardWsQBuffers = 1;

// Windows of at most this many keys keep two consumer warpgroups at head dim 64 (below).
constexpr int64_t kFlashNarrowWindowKeys = 256;

// The logit transforms a warp-specialised forward kernel is compiled for
// (flash_forward_sm90_ws_kernel's kForm). The general kernel tests every feature at run time,
// a branch around each per tile, and each branch ends a stretch ptxas can schedule across; the
// others have only their own features' code in the consumers' loop.
enum class FlashLogitForm {
  kGeneral,
  kPlain,            // scores times the scale, masked; with or without a sink
  kSoftcapFixedMax,  // softcap under the fixed max (FlashForwardParams::softcap_fixed_max:
                     // bf16, cap <= 50.25, no ALiBi), masked; with or without a sink
};

// The head dims with a plain-logits kernel: 64, where the consumers' instruction issue binds
// and the features' run-time tests cost 4-17% (docs/perf.md, session 25). At 128 the same
// kernel measured 0.90-1.01x, so d128 keeps the general one (and its compile time).
constexpr bool flash_forward_has_plain_logits(int head_dim_qk, int head_dim_v) {
  return head_dim_qk == 64 && head_dim_v == 64;
}

// The head dims with a softcap kernel (bf16 only, as the fixed max): 64, 128 and 256, the rows
// of issue 17's softcap bar. At 64 and 128 it measured 1.02-1.08x of the general kernel
// (docs/perf.md, session 26), at 256 1.10-1.15x (session 27, when its ws form became the
// default).
constexpr bool flash_forward_has_softcap_logits(int head_dim_qk, int head_dim_v) {
  return head_dim_qk == head_dim_v &&
         (head_dim_qk == 64 || head_dim_qk == 128 || head_dim_qk == 256);
}

// The kernel a problem runs on: dropout and ALiBi take the general one, and so does a softcap
// whose max is online (fp16, caps above 50.25).
constexpr FlashLogitForm flash_forward_logit_form(int head_dim_qk, int head_dim_v, bool softcap,
                                                  bool softcap_fixed_max, bool alibi,
                                                  bool dropout) {
  if (alibi || dropout) return FlashLogitForm::kGeneral;
  if (!softcap)
    return flash_forward_has_plain_logits(head_dim_qk, head_dim_v) ? FlashLogitForm::kPlain
                                                                   : FlashLogitForm::kGeneral;
  return softcap_fixed_max && flash_forward_has_softcap_logits(head_dim_qk, head_dim_v)
             ? FlashLogitForm::kSoftcapFixedMax
             : FlashLogitForm::kGeneral;
}

// Consumer warpgroups: three (192 query rows) at head dim 64, where a tile's GEMMs are half as
// long as at 128 while its softmax is as long, so two warpgroups in ping-pong leave the tensor
// cores idle; a third one's softmax fills the gap (FlashAttention-3's 192 x 128 tile). Its
// registers (160 per consumer thread) hold S, P and a 64-column O. Two elsewhere: wider heads
// need the registers (240 per thread) for O; and under a narrow window (`window_span`, from
// dpa::window_span in core/problem.h, at most kFlashNarrowWindowKeys), where a 192-row block sees
// 191 more keys than one query does, most of them in partly masked tiles. Measured at d = 64
// (docs/perf.md, session 20): three warpgroups took 0.86-0.88x the time of two under a window of
// 1024 keys and 1.07-1.08x under one of 128 (gpt-oss); the bound between them is not measured.
constexpr int flash_forward_wgmma_ws_consumers(int head_dim_qk, int head_dim_v,
                                               int64_t window_span = -1) {
  const bool narrow_window = window_span >= 0 && window_span <= kFlashNarrowWindowKeys;
  return head_dim_qk == 64 && head_dim_v == 64 && !narrow_window ? 3 : 2;
}

// GQA packing in the warp-specialised form (FlashForwardParams::packed_heads,
// docs/cuda_flash.md): a block's rows are block_m / G positions of all G query heads of one KV
// head, one head per 16-row slab, so a narrow window's block spans block_m / G positions instead
// of block_m and takes fewer keys. That pays on 64-key tiles only (on 128-key tiles a window of
// 128 still crosses one tile boundary per block), so the packed form is a kernel on 64-key tiles
// at head dim 64 (gpt-oss), with kFlashPackedConsumers consumers, for G of 4 or 8 (block_m / G a
// multiple of 16; 2 would divide too, but gains little). Dropout keeps one head per block.
// `group_size` is 1 where the rows cannot pack (flash_forward_packable_group: keys past a sequence
// inside the tensor, thd); the plan still checks TMA and one split and runs the tile unpacked
// without them.
constexpr int kFlashPackedBlockN = 64;
// The packed form's consumer warpgroups: four (256 rows: 32 positions of 8 heads, 64 of 4), so
// that a block's three or four masked tiles carry twice the rows of a two-consumer block, and
// its fixed costs (Q's load, the first S and the last P V without overlap, O's store) half as
// much per row. A consumer keeps 112 registers (the launch's 96 per thread, the producer's 24
// given back), which its 64-key tile's S, P and O fit without spills (ptxas, session 48).
constexpr int kFlashPackedConsumers = 4;
// The widest window that packs. Packing pays most where a block's rows see few keys (the window
// of 128: 1.22-1.30x, docs/perf.md, session 50), but it also trims a wider window's masked tiles
// (32 positions see span + 31 keys in 64-key tiles, where 192 unpacked rows see span + 191 in
// 128-key tiles) and reads each K / V tile once for G heads. Measured against the bound of 256
// (session 51, docs/perf.md): 1.29x at a window of 512, 1.10-1.25x at 1024, 1.07x at 2048 and
// 1.03x at 4096; wider was not measured, so packing stops there.
constexpr int64_t kFlashPackedWindowKeys = 4096;
constexpr bool flash_forward_packs_gqa(int head_dim_qk, int head_dim_v, int64_t window_span,
                                       int64_t group_size) {
  const bool packed_window = window_span >= 0 && window_span <= kFlashPackedWindowKeys;
  return head_dim_qk == 64 && head_dim_v == 64 && packed_window &&
         (group_size == 4 || group_size == 8);
}

// The group size flash_forward_packs_gqa may pack: query heads per KV head where TMA copies
// every key tile (bshd or sbhd whose key sequences fill their rows: no cp.async tails), else 1.
constexpr int64_t flash_forward_packable_group(int64_t heads_q, int64_t heads_kv, bool thd,
                                               bool keys_fill_rows) {
  return heads_kv > 0 && !thd && keys_fill_rows ? heads_q / heads_kv : 1;
}

// Keys per tile of the warp-specialised form: the base tile's, except 80 at head dim 256
// without a bounded window or dropout (FlashAttention-3's tile there: with two stages whose K
// and V have barriers of their own it measured 1.00-1.10x of the 64-key tile, docs/perf.md,
// session 28). A window bounded on both sides (`window_span` >= 0: causal counts as a right
// bound of 0) and dropout keep 64 keys at 256: a windowed row measured 0.82x on the 80-key tile,
// and the quads draw dropout's keep bits four 8-key Philox blocks at a time, so its tile is a
// power of two (as a paged tile is whole boxes of pages; paged K/V reach this kernel only at
// head dims 64 and 128, kvcache_prefill_on_flash). A window bounded on one side only sees as
// many keys per row as no window does, and takes 80.
constexpr int flash_forward_wgmma_ws_block_n(int head_dim_qk, int head_dim_v,
                                             int64_t window_span = -1, bool dropout = false,
                                             int64_t group_size = 1) {
  if (head_dim_qk == 256 && head_dim_v == 256 && window_span < 0 && !dropout) return 80;
  if (!dropout && flash_forward_packs_gqa(head_dim_qk, head_dim_v, window_span, group_size))
    return kFlashPackedBlockN;
  return flash_forward_wgmma_tile_shape(head_dim_qk, head_dim_v).block_n;
}

constexpr FlashTileShape flash_forward_wgmma_ws_tile_shape(int head_dim_qk, int head_dim_v,
                                                           int64_t window_span = -1,
                                                           bool dropout = false,
                                                           int64_t group_size = 1) {
  FlashTileShape shape = flash_forward_wgmma_tile_shape(head_dim_qk, head_dim_v);
  shape.warp_specialized = true;
  shape.block_n =
      flash_forward_wgmma_ws_block_n(head_dim_qk, head_dim_v, window_span, dropout, group_size);
  const bool packs =
      !dropout && flash_forward_packs_gqa(head_dim_qk, head_dim_v, window_span, group_size);
  if (packs) shape.packed_heads = int(group_size);
  const int consumers =
      packs ? kFlashPackedConsumers
            : flash_forward_wgmma_ws_consumers(head_dim_qk, head_dim_v, window_span);
  shape.block_m = 64 * consumers;
  shape.warps = 4 * (1 + consumers);
  const int stages =
      flash_forward_wgmma_ws_stages(head_dim_qk, head_dim_v, shape.block_m, shape.block_n);
  shape.shared_bytes = 2 * (kFlashForwardWsQBuffers * shape.block_m * head_dim_qk +
                            stages * shape.block_n * (head_dim_qk + head_dim_v)) +
                       1024 + kFlashWsBarrierBytes;
  return shape;
}

constexpr FlashTileShape flash_forward_tile_shape(int head_dim_qk, int head_dim_v,
                                                  bool decode = false, bool hopper = false) {
  if (hopper && !decode && flash_forward_wgmma_eligible(head_dim_qk, head_dim_v))
    return flash_forward_wgmma_tile_shape(head_dim_qk, head_dim_v);
  // Wide heads use 8 warps of 16 rows to keep the O accumulator in registers; narrow heads
  // 4 warps of 32 rows (half the shared-memory traffic per MMA). Rows are padded by 8
  // elements to keep ldmatrix free of bank conflicts. Decode uses one warp of 16 rows.
  const bool wide = head_dim_qk > 128 || head_dim_v > 128;
  FlashTileShape shape;
  shape.block_n = 64;
  shape.warps = decode ? 1 : (wide ? 8 : 4);
  shape.slabs = decode ? 1 : 128 / (16 * shape.warps);
  shape.block_m = 16 * shape.warps * shape.slabs;
  // Normal tiles use all 255 registers per thread: two blocks fit an SM. One-warp decode
  // blocks are limited by shared memory; four is a conservative count for the widest head.
  shape.blocks_per_sm = decode ? 4 : 2;
  shape.shared_bytes =
      flash_forward_shared_bytes(shape.block_m, shape.block_n, head_dim_qk, head_dim_v);
  return shape;
}

// The one-kernel backward's tiles (flash_backward_kernel.cuh reads these): a dq block of 64 query
// rows against key tiles of 64 (32 for head dims above 128), a dk/dv block of 64 keys against
// query tiles of 32; rows padded by 8 elements; two stages of the streamed operand.
constexpr bool flash_backward_wide(int head_dim_qk, int head_dim_v) {
  return head_dim_qk > 128 || head_dim_v > 128;
}
constexpr int flash_backward_dq_block_n(int head_dim_qk, int head_dim_v) {
  return flash_backward_wide(head_dim_qk, head_dim_v) ? 32 : 64;
}
constexpr int flash_backward_dq_shared_bytes(int head_dim_qk, int head_dim_v) {
  // Q and dO of the block, two stages of K and V.
  return 2 * (64 + 2 * flash_backward_dq_block_n(head_dim_qk, head_dim_v)) *
         (head_dim_qk + 8 + head_dim_v + 8);
}
constexpr int flash_backward_dkdv_shared_bytes(int head_dim_qk, int head_dim_v) {
  // K and V of the block, two stages of Q and dO with their LSE and D (fp32), and each warp's
  // dropout keep masks (one byte per query and 8-key block).
  return 2 * (64 + 2 * 32) * (head_dim_qk + 8 + head_dim_v + 8) + 2 * 2 * 32 * 4 + 4 * 2 * 32;
}
constexpr int flash_backward_shared_bytes(int head_dim_qk, int head_dim_v) {
  const int dq = flash_backward_dq_shared_bytes(head_dim_qk, head_dim_v);
  const int dkdv = flash_backward_dkdv_shared_bytes(head_dim_qk, head_dim_v);
  return dq > dkdv ? dq : dkdv;
}

// The one-kernel backward's narrow form (flash_backward_sm90_one_kernel.cuh) takes head dims 64
// and 128: wider heads' tiles and accumulators do not fit beside each other.
constexpr bool flash_backward_one_kernel_narrow_eligible(int head_dim_qk, int head_dim_v) {
  return (head_dim_qk == 64 || head_dim_qk == 128) && (head_dim_v == 64 || head_dim_v == 128);
}

// The wide form of the one-kernel backward (flash_backward_sm90_one_kernel_wide.cuh) takes the
// compiled head dims above 128, all whole 64-column blocks: 256, 192 and MLA's 192 / 128. Its two
// consumers split the head dims between them (flash_backward_wide_split).
constexpr bool flash_backward_one_kernel_wide_eligible(int head_dim_qk, int head_dim_v) {
  return (head_dim_qk == 256 && head_dim_v == 256) ||
         (head_dim_qk == 192 && (head_dim_v == 192 || head_dim_v == 128));
}

// How the wide form's two consumers split the head dims, in 64-column blocks: consumer 0 keeps
// the first `qk_blocks` blocks of dk (and of each dq tile) and the first `v_blocks` of dv,
// consumer 1 the rest. Consumer 0 takes half of dk's blocks, rounded up; dv's blocks then go where
// they even out the two consumers' products (a block of dk is two products' columns, dk += dU^T Q
// and dq = dU K, a block of dv one), the most to consumer 0 among equally even splits. 256: two
// and two each; 192: consumer 0 two of dk and one of dv; 192 / 128: consumer 0 two of dk, consumer
// 1 one of dk and both of dv.
struct FlashBackwardWideSplit {
  int qk_blocks, v_blocks;
};
constexpr FlashBackwardWideSplit flash_backward_wide_split(int head_dim_qk, int head_dim_v) {
  const int qk_blocks = head_dim_qk / 64, v_blocks = head_dim_v / 64;
  const int first = (qk_blocks + 1) / 2;
  int best = v_blocks, best_gap = -1;
  for (int v_first = v_blocks; v_first >= 0; --v_first) {
    const int gap = (2 * first + v_first) - (2 * (qk_blocks - first) + v_blocks - v_first);
    const int magnitude = gap < 0 ? -gap : gap;
    if (best_gap < 0 || magnitude < best_gap) {
      best = v_first;
      best_gap = magnitude;
    }
  }
  return {first, best};
}

// The wide form's shared memory: K and V of its 64 keys, two stages of 64-row Q and dO tiles and
// of their rows' LSE and D, two buffers each of the P^T and dU^T tiles (64 x 64), the dropout
// keep words of two stages where they fit (`with_keep_words`: 128 words per stage, the narrow
// form's layout for 64 keys, draw_query_tile_keep_words), 64 bytes of barriers and 1 KB of
// alignment.
constexpr int flash_backward_wide_shared_bytes(int head_dim_qk, int head_dim_v,
                                               bool with_keep_words) {
  const int block_n = 64, block_m = 64, stages = 2, operand_tile = block_n * block_m * 2;
  const int keep_words = with_keep_words ? block_n / 16 * 32 : 0;
  return 2 * (block_n + stages * block_m) * (head_dim_qk + head_dim_v) + stages * 2 * block_m * 4 +
         4 * operand_tile + stages * keep_words * 4 + 64 + 1024;
}
// Whether the wide form takes dropout: its keep words fit at 192 and 192 / 128, not at 256
// (226 KB of tiles, 64 bytes short).
constexpr bool flash_backward_wide_takes_dropout(int head_dim_qk, int head_dim_v) {
  return flash_backward_one_kernel_wide_eligible(head_dim_qk, head_dim_v) &&
         flash_backward_wide_shared_bytes(head_dim_qk, head_dim_v, true) <= 227 * 1024;
}

// The backward's kernel families (docs/cuda_flash.md): the atomic-free pair on mma.sync, and the
// single wgmma kernel whose dq goes through fp32 reductions (flash_backward_sm90_one_kernel.cuh).
enum class FlashBackwardFamily { kAutomatic, kMmaSync, kOneKernel };

// The config's backward kernel family (tests and benches; kAuto: chosen by device and shape).
constexpr FlashBackwardFamily requested_backward_family(FlashBackwardKernel kernel) {
  switch (kernel) {
    case FlashBackwardKernel::kMmaSync:
      return FlashBackwardFamily::kMmaSync;
    case FlashBackwardKernel::kOneKernel:
      return FlashBackwardFamily::kOneKernel;
    case FlashBackwardKernel::kAuto:
      break;
  }
  return FlashBackwardFamily::kAutomatic;
}

// The family that runs a backward. sm_90 with head dims 64 / 128 takes the one-kernel backward
// with every feature (deterministic mode orders its dq reductions: kDeterministicKeyChain);
// head dims 256, 192 and 192 / 128 its wide form, deterministic mode included (its consumers
// order their own reductions) and, at 192 and 192 / 128, dropout; 256 with dropout, and
// everything else (head dim 96, other GPUs), takes mma.sync. Deterministic mode does not change
// the family: every form takes it. `requested` (config.flash_backward_kernel, for tests and
// benches) picks another family where the hardware has it, never the one-kernel one against a
// feature it cannot honour.
constexpr FlashBackwardFamily flash_backward_family(int arch, int head_dim_qk, int head_dim_v,
                                                    bool dropout, FlashBackwardFamily requested) {
  if (arch != 90) return FlashBackwardFamily::kMmaSync;
  if (!flash_backward_one_kernel_narrow_eligible(head_dim_qk, head_dim_v)) {
    // The wide head dims have the one-kernel backward alone on Hopper; the pairs stay on mma.sync.
    const bool one_kernel_requested = requested == FlashBackwardFamily::kAutomatic ||
                                      requested == FlashBackwardFamily::kOneKernel;
    return flash_backward_one_kernel_wide_eligible(head_dim_qk, head_dim_v) &&
                   (!dropout || flash_backward_wide_takes_dropout(head_dim_qk, head_dim_v)) &&
                   one_kernel_requested
               ? FlashBackwardFamily::kOneKernel
               : FlashBackwardFamily::kMmaSync;
  }
  return requested == FlashBackwardFamily::kMmaSync ? FlashBackwardFamily::kMmaSync
                                                    : FlashBackwardFamily::kOneKernel;
}

// Shared memory per block of the one-kernel backward. Its traits assert this against their
// layouts, so the selector's rule (through flash_backward_plan) checks the bytes the launch asks
// for.
// The narrow one-kernel backward's key block and query tile (FlashBackwardSm90OneKernelTraits
// asserts them): the host sizes its deterministic-mode flags by them. The wide form's key block
// is 64 keys and its query tile the same 64 rows (FlashBackwardSm90OneKernelWideTraits asserts
// them).
constexpr int kOneKernelBackwardBlockN = 128, kOneKernelBackwardBlockM = 64;
constexpr int flash_backward_one_kernel_block_n(int head_dim_qk, int head_dim_v) {
  return flash_backward_one_kernel_wide_eligible(head_dim_qk, head_dim_v)
             ? 64
             : kOneKernelBackwardBlockN;
}
// The narrow form's query tile: 128 rows at head dim 64 without dropout, whose consumers then
// issue S^T and dP^T as one N = 128 product each and pay the barriers, waits and statistics'
// loads once per 128 queries (FlashAttention-4's sm90 tile there; docs/cuda_flash.md: d64
// 1.05x, deterministic 1.15x on an H100, docs/perf.md, session 41), except under a narrow window
// (`window_span` at most kFlashNarrowWindowKeys, as the forward's rule), where a key block
// visits few query tiles per head and the longer fill and drain of 128-row stages cost more
// (gpt-oss window 128: 0.90-0.93x; window 1024: 1.00x). 64 elsewhere (head dim 128's
// accumulators, and the dropout form's keep words of 64 queries, fill the registers). A
// 128-row tile's dq is two workspace tiles of kOneKernelBackwardBlockM rows in a row.
constexpr bool flash_backward_one_kernel_takes_128_rows(int head_dim_qk, int head_dim_v,
                                                        bool dropout) {
  return head_dim_qk == 64 && head_dim_v == 64 && !dropout;
}
constexpr int flash_backward_one_kernel_block_m(int head_dim_qk, int head_dim_v, bool dropout,
                                                int64_t window_span) {
  const bool narrow_window = window_span >= 0 && window_span <= kFlashNarrowWindowKeys;
  return flash_backward_one_kernel_takes_128_rows(head_dim_qk, head_dim_v, dropout) &&
                 !narrow_window
             ? 2 * kOneKernelBackwardBlockM
             : kOneKernelBackwardBlockM;
}
// The one-kernel family's fp32 dq workspace: [b, H, rows, dqk] with each (batch, head)'s rows
// rounded up to whole 128-row query tiles (the largest of any form), so that a tile of either
// size is one contiguous range of floats: 64-row tiles of 64 x dqk floats, each in fragment
// order for the narrow form (dq_fragment_offset), in row order for the wide form.
constexpr int kDqWorkspaceRowMultiple = 2 * kOneKernelBackwardBlockM;
constexpr int64_t dq_workspace_rows(int64_t max_seqlen_q) {
  return (max_seqlen_q + kDqWorkspaceRowMultiple - 1) / kDqWorkspaceRowMultiple *
         kDqWorkspaceRowMultiple;
}

// Where the narrow one-kernel backward keeps dq element (row, column) of a 64-row tile, in floats
// from the tile's start: the consumers' accumulator fragments in register order. Consumer c owns
// columns [c dqk / 2, (c + 1) dqk / 2) (its half: 32 dqk floats); in it, thread w of the
// warpgroup (warp w / 32, quad row g = w % 32 / 4, quad column q = w % 4) holds for each n8
// column tile t the float4 (row 16 (w / 32) + g, columns 8 t + 2q, + 1; row + 8, the same
// columns) at t * 512 + 4 w. So a warp stores or loads 512 contiguous bytes per float4 (no bank
// conflict, no padding), and a 16-float chunk (4 threads of a quad row) holds columns
// 8 t .. 8 t + 7 of rows 16 (w / 32) + g and + 8.
constexpr int dq_fragment_offset(int row, int column, int head_dim_qk) {
  const int half = head_dim_qk / 2, consumer = column / half, c = column % half;
  const int thread = row / 16 * 32 + row % 8 * 4 + c % 8 / 2;
  return consumer * 32 * head_dim_qk + c / 8 * 512 + 4 * thread + row % 16 / 8 * 2 + c % 2;
}

// Where float4 `index` of fragment-order dq tiles in a row lies (dq_fragment_offset's inverse, in
// float4s; 64-row tile index / (16 dqk) of the row): its x and y are columns `column` and + 1 of
// row `row`, its z and w the same columns of row + 8 (one consumer thread's fragment of one n8
// tile).
struct DqFragmentPosition {
  int row, column;
};
constexpr DqFragmentPosition dq_fragment_position(int index, int head_dim_qk) {
  const int tile_rows = index / (16 * head_dim_qk) * 64;
  const int consumer = index / (8 * head_dim_qk) % 2, rest = index % (8 * head_dim_qk);
  const int tile = rest / 128, thread = rest % 128;
  return {tile_rows + thread / 32 * 16 + thread % 32 / 4,
          consumer * head_dim_qk / 2 + 8 * tile + 2 * (thread % 4)};
}

// The narrow form's dq tiles in shared memory: two at head dim 128, so that the consumers store
// tile j + 1 while the copy engine still reads tile j (bulk reductions, one per tile, outside
// deterministic mode); one at head dim 64, read and added by the producer's threads (there the
// bulk form lost to the threads' adds: 0.955-0.965x, docs/perf.md, session 40).
constexpr int flash_backward_one_kernel_dq_buffers(int head_dim_qk) {
  return head_dim_qk == 128 ? 2 : 1;
}
// Whether the narrow form's dq tiles take tickets (FlashBackwardParams::dq_tickets): where the
// producer's 128 threads add each tile to the workspace (one dq buffer, no dropout, whose head
// dim 64 form adds from the consumers' registers) outside deterministic mode. The first key
// block to take a tile's ticket stores its partial and the later ones add to it, so the
// workspace needs no zeroing; a tile no block took is written as zeros by the conversion. The
// zeroing moved the whole workspace (2 x 64 x 8192 x 64 floats for gpt-oss, about 88 us of a
// 0.99 ms backward under its window of 128 on an H100, docs/perf.md, session 51). Only at
// 64-row query tiles (narrow windows), where few key blocks share a tile: without a window or
// under a wide one (128-row tiles) the key blocks reach each tile together and the later tickets'
// waits for the first store cost more than the zeroing saves (d64 0.84x, causal 0.86x, window
// 1024 0.90x against 1.06x at the gpt-oss window of 128, session 52), and that form's producer
// spilled 32 / 16 bytes more with them.
constexpr int kDqTicketStored = 1 << 30, kDqTicketCount = kDqTicketStored - 1;
constexpr bool flash_backward_dq_takes_tickets(int head_dim_qk, int head_dim_v, bool dropout,
                                               bool deterministic, int query_tile_rows) {
  return flash_backward_one_kernel_narrow_eligible(head_dim_qk, head_dim_v) &&
         flash_backward_one_kernel_dq_buffers(head_dim_qk) == 1 && !dropout && !deterministic &&
         query_tile_rows == 64;
}
// The narrow form's dU^T buffers: two, so that a consumer stores tile j + 1's dU^T while the other
// may still read tile j's in its dq product; one in head dim 128's dropout form, where the keep
// words and the second dq tile leave no room for two (the consumers then wait for each other's
// dq product before storing, an mbarrier that has nearly always completed by then).
constexpr int flash_backward_one_kernel_du_buffers(int head_dim_qk, bool dropout) {
  return head_dim_qk == 128 && dropout ? 1 : 2;
}
// `block_m`: the narrow form's query tile (flash_backward_one_kernel_block_m; the wide form's is
// 64 rows).
constexpr int flash_backward_one_kernel_shared_bytes(int head_dim_qk, int head_dim_v, bool dropout,
                                                     int block_m) {
  const int dims = head_dim_qk + head_dim_v, stages = 2, barriers = 128;
  if (flash_backward_one_kernel_wide_eligible(head_dim_qk, head_dim_v))
    return flash_backward_wide_shared_bytes(
        head_dim_qk, head_dim_v, flash_backward_wide_takes_dropout(head_dim_qk, head_dim_v));
  const int block_n = kOneKernelBackwardBlockN,
            du = flash_backward_one_kernel_du_buffers(head_dim_qk, dropout) * block_n * block_m * 2,
            keep_words = dropout ? block_n / 16 * 32 : 0;
  return 2 * (block_n + stages * block_m) * dims + stages * 2 * block_m * 4 + du +
         flash_backward_one_kernel_dq_buffers(head_dim_qk) * block_m * head_dim_qk * 4 +
         stages * keep_words * 4 + barriers + 1024;
}

// What a backward runs: its family and that family's shared memory per block. The selector's
// rule and the launch both take it, so what the rule accepts is what runs.
// `query_tile_rows`: the one-kernel family's query tile (FlashBackwardParams::query_tile_rows),
// from `window_span` (dpa::window_span in core/problem.h); 64 for the mma.sync pair, which does
// not read it.
struct FlashBackwardPlan {
  FlashBackwardFamily family;
  int shared_bytes;
  int query_tile_rows;
};
constexpr FlashBackwardPlan flash_backward_plan(int arch, int head_dim_qk, int head_dim_v,
                                                bool dropout, FlashBackwardFamily requested,
                                                int64_t window_span) {
  const FlashBackwardFamily family =
      flash_backward_family(arch, head_dim_qk, head_dim_v, dropout, requested);
  switch (family) {
    case FlashBackwardFamily::kOneKernel: {
      const int block_m =
          flash_backward_one_kernel_block_m(head_dim_qk, head_dim_v, dropout, window_span);
      return {family,
              flash_backward_one_kernel_shared_bytes(head_dim_qk, head_dim_v, dropout, block_m),
              block_m};
    }
    case FlashBackwardFamily::kMmaSync:
    case FlashBackwardFamily::kAutomatic:
      break;
  }
  return {FlashBackwardFamily::kMmaSync, flash_backward_shared_bytes(head_dim_qk, head_dim_v),
          kOneKernelBackwardBlockM};
}

// The query rows [first, last] (empty when last < first) that see at least one key of
// [first_key, last_key] (DESIGN.md §3: i + delta - l <= j <= i + delta + r, -1 unbounded), for
// the backward's dk/dv kernels, which walk only those query tiles. Host and device.
struct QueryRange {
  int first, last;
};
#if defined(__CUDACC__)
__host__ __device__
#endif
    constexpr QueryRange
    queries_seeing_keys(int first_key, int last_key, int seqlen_q, int diagonal, int window_left,
                        int window_right) {
  QueryRange range{0, seqlen_q - 1};
  if (window_right >= 0) {
    const int lowest = first_key - diagonal - window_right;
    range.first = lowest > 0 ? lowest : 0;
  }
  if (window_left >= 0) {
    const int highest = last_key - diagonal + window_left;
    range.last = highest < seqlen_q - 1 ? highest : seqlen_q - 1;
  }
  return range;
}

// The query tiles [first, last] of `block_m` rows (empty when last < first) whose rows see some
// key of the key block starting at `j0` (`block_n` keys, clipped to the sequence; empty past
// it). The dk/dv kernels and the one-kernel backward walk exactly these tiles (make_key_block).
// A tile's contributing key blocks are then contiguous: each block's tiles run from
// queries_seeing_keys' first to last row, and both bounds are nondecreasing in j0.
struct QueryTileSpan {
  int first, last;
};
#if defined(__CUDACC__)
__host__ __device__
#endif
    constexpr QueryTileSpan
    key_block_query_tiles(int j0, int block_n, int block_m, int seqlen_q, int seqlen_kv,
                          int diagonal, int window_left, int window_right) {
  if (j0 < 0 || j0 >= seqlen_kv) return {0, -1};
  const int last_key = (seqlen_kv - j0 < block_n ? seqlen_kv : j0 + block_n) - 1;
  const QueryRange rows =
      queries_seeing_keys(j0, last_key, seqlen_q, diagonal, window_left, window_right);
  if (rows.last < rows.first) return {0, -1};
  return {rows.first / block_m, rows.last / block_m};
}

// The deterministic one-kernel backward adds a query tile's dq partials in key-block order: key
// block n waits for block n - 1 when that block also adds to the tile (else n is the tile's
// first: the contributors are contiguous, key_block_query_tiles), then hands the tile to n + 1.
// Key blocks run in chains of `chain` (kDeterministicKeyChain where the grid allows) per
// (batch, KV head): grid x is the place in the chain, y the KV head, z the batch plus
// batch_count times the chain's index. A block then waits only for blocks of a lower linear
// index (launched before it), so the order cannot deadlock, and the blocks resident together
// wait in chains of at most `chain` hand-offs, while each head's Q and dO are read by a few
// chains at a time (the L2 keeps them).
constexpr int kDeterministicKeyChain = 16;
struct KeyBlockCoordinates {
  int batch, key_block;
};
#if defined(__CUDACC__)
__host__ __device__
#endif
    constexpr KeyBlockCoordinates
    deterministic_key_block(int x, int z, int batch_count, int chain) {
  return {z % batch_count, (z / batch_count) * chain + x};
}

// The chain length for `key_blocks` key blocks per sequence: kDeterministicKeyChain, or all of
// them (one chain, the grid's usual order) where batch x chains would pass the grid's z limit.
constexpr int deterministic_key_chain(int batch_count, int key_blocks) {
  const int chains = (key_blocks + kDeterministicKeyChain - 1) / kDeterministicKeyChain;
  return int64_t(batch_count) * chains <= 65535 || key_blocks < 1 ? kDeterministicKeyChain
                                                                  : key_blocks;
}

// The (dqk, dv) pairs with compiled kernels (both dtypes).
bool flash_forward_has_head_dims(int64_t head_dim_qk, int64_t head_dim_v);

// The most splits choose_num_splits returns (the merge holds a weight per split: merge_row.cuh).
constexpr int kFlashMaxSplits = 128;

// How many ways to split the KV axis so that small-query problems (decode) fill the GPU:
// 1 when the (batch, head, query-block) grid already fills every resident-block slot, else
// enough splits for one full wave, each covering at least two KV tiles, at most kFlashMaxSplits.
int choose_num_splits(int64_t batch, int64_t heads, int64_t query_blocks, int64_t kv_blocks,
                      int sm_count, int blocks_per_sm);

}  // namespace dpa::cuda
