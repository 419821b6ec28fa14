// The plain parameter struct of the flash forward kernels (FA2-style: raw pointers, element
// strides, sizes and runtime feature flags), passed to the kernel by value. Host-includable.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "core/philox.h"

namespace dpa::cuda {

struct FlashForwardParams {
  // Tensors. Rows are addressed as base + b * batch_stride + row * row_stride + h * head_stride
  // where row = start[b] + i (thd) or i (bshd / sbhd).
  const void* q = nullptr;  // [.., sq, H, dqk]
  const void* k = nullptr;  // [.., skv, G, dqk]
  const void* v = nullptr;  // [.., skv, G, dv]
  void* o = nullptr;        // [.., sq, H, dv]
  float* lse = nullptr;     // [b, H, sq] or thd [H, tq]
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;  // lse index: b*bs + h*hs + start_q[b] + i

  // Per-sequence tables on the device, [b] each (see cuda/sequence_tables.h).
  const int* seqlen_q = nullptr;
  const int* seqlen_kv = nullptr;
  const int* start_q = nullptr;
  const int* start_kv = nullptr;

  int batch = 0, heads_q = 0, heads_kv = 0, group_size = 1;
  int max_seqlen_q = 0, max_seqlen_kv = 0;

  // Logits in log2 units: s2 = scale_log2 * (q.k)            without a cap,
  //                       s2 = softcap_log2 * tanh(softcap_arg_scale * (q.k)) with a cap c,
  // where softcap_arg_scale = scale / c and softcap_log2 = c * log2(e): the scale folds into
  // the tanh argument and the cap into the exp2 exponent, so each element costs one FMUL
  // before the tanh and one after.
  float scale_log2 = 0.f;
  float softcap_arg_scale = 0.f;
  float softcap_log2 = 0.f;
  bool use_softcap = false;
  // Softcap bounds every logit to [-c', c'] (c' = softcap_log2): the bf16 forward then shifts by
  // a fixed max instead of a running one (flash_tile_math.cuh, SoftmaxShift), where
  // softcap_fixed_max_applies (flash_forward_plan.h) says it stays exact.
  bool softcap_fixed_max = false;
  // The online max's slack (flash_tile_math.cuh, kMaxSlack): P stays below 2^max_slack, and
  // dropout scales it by 1 / keep_prob, which an fp16 P must hold (forward_max_slack).
  float max_slack = 8.f;

  // Visibility (DESIGN.md §3): window (-1 = unbounded); the diagonal offset of each sequence
  // (SequenceTables::diagonal: bottom-right skv - sq, top-left 0, or a CP tile's global delta).
  int window_left = -1, window_right = -1;
  const int* diagonal = nullptr;  // [b] device

  // Context-parallel tiles: dropout draws at row + q_position[b], key + kv_position[b] (key
  // positions multiples of 8: the selector checks), head + head_offset among heads_total; a
  // forward partial leaves the sink out (the CP merge adds it once).
  const int* q_position = nullptr;   // [b] device, 0 outside CP
  const int* kv_position = nullptr;  // [b] device, 0 outside CP
  int head_offset = 0, heads_total = 0;
  bool exclude_sink = false;

  // ALiBi: slope = alibi_slopes[b * alibi_batch_stride + h]; nullptr disables it.
  const float* alibi_slopes = nullptr;
  int alibi_batch_stride = 0;

  // Sink: 0 vanilla, 1 off-by-one (sigma = 0), 2 learnable (sigma = softmax_offset[h]).
  int softmax_type = 0;
  const float* softmax_offset = nullptr;

  // Dropout (DESIGN.md §5): threshold 0 disables it.
  uint32_t dropout_threshold = 0;
  float dropout_scale = 1.f;  // 1 / keep_prob
  uint64_t seed = 0, offset = 0;
  // The seed's Philox round keys (philox_round_keys of its two words), for the kernels' draws.
  PhiloxRoundKeys dropout_round_keys{};

  // Split-KV: each of num_splits blocks of work covers blocks_per_split KV tiles and writes
  // fp32 partials [split, b, H, max_sq, dv] / [split, b, H, max_sq] (natural-log LSE, no sink);
  // a merge kernel combines them and adds the sink once.
  bool wgmma = false;  // the sm_90a warpgroup kernel (flash_forward_tile_shape(.., hopper))
  bool warp_specialized = false;  // its producer / ping-pong form (flash_forward_sm90_ws.cuh)
  // That form's consumer warpgroups of 64 query rows (flash_forward_wgmma_ws_consumers).
  int consumer_warpgroups = 2;
  // Keys per tile of the planned shape: the warp-specialised form has two at some head dims
  // (flash_forward_wgmma_ws_block_n), and its tensor maps' boxes are this many rows.
  int block_n = 0;
  bool decode = false;  // one-warp 16-row tiles (flash_forward_tile_shape(.., decode = true))
  // GQA packing (flash_forward_packs_gqa, warp-specialised kernel with TMA only): a block of
  // work is block_m / packed_heads positions of the packed_heads query heads of one KV head,
  // head-major (16-row slab s is head s / (block_m / packed_heads / 16) of the group); Q's map
  // then has boxes of block_m / packed_heads rows by packed_heads heads. 1: one head per block.
  int packed_heads = 1;
  // The warp-specialised kernel's grid: at most this many blocks, each looping over blocks of
  // work (a persistent grid: one block per SM); 0 launches one block per block of work.
  int persistent_blocks = 0;
  // Dynamic scheduling of a persistent grid (causal and one-sided windows, whose blocks of work
  // differ in length): each block's producer takes its next block of work from this counter,
  // zeroed before the launch; null: the static stride. Only with TMA, no tails and no pages.
  int* tile_counter = nullptr;
  int num_splits = 1;
  int blocks_per_split = 0;
  float* partial_o = nullptr;
  float* partial_lse = nullptr;

  // Bulk tensor copies (TMA) of Q, K and V in the warp-specialised kernel, with boxes of
  // block_m (Q) and block_n (K, V) rows by 64 columns (cuda/tensor_map.h). The maps address
  // [batch, rows, heads, dim]; a packed (thd) tensor's map has one batch of all its rows, a
  // paged cache's one batch per page (boxes of min(page size, block_n) rows). Rows past the
  // tensor read as zeros. Rows past a sequence inside the tensor (padding, the next packed
  // sequence, a cache's stale rows) are not zeros, and a masked key's P = 0 times a non-finite
  // V there would reach O: with tma_tails, the key tiles that cross a sequence's end are copied
  // with cp.async instead, zero-filled past the sequence. Q's rows past a sequence are never
  // stored, so Q always comes by TMA.
  bool tma = false;
  bool tma_tails = false;
  CUtensorMap q_map{}, k_map{}, v_map{};

  // Paged K and V (a KV cache's pages [pages, page size, G, d], docs/kvcache.md; the
  // warp-specialised kernel only): key n of sequence b is row n % page size
  // of page block_table[b * block_table_stride + n / page size], pages k_batch_stride
  // (v_batch_stride) elements apart. nullptr: rows of the batch, as above.
  const int* block_table = nullptr;
  int64_t block_table_stride = 0;
  int page_shift = 0;  // log2 of the page size
};

}  // namespace dpa::cuda
