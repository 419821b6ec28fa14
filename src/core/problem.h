// AttentionProblem: one validated, fully resolved attention call, as every backend sees it.
// Built by core/problem_builder.cc from the public config and arguments; backends never
// re-derive defaults (scale, causal window, alignment) themselves.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "dpa/arguments.h"
#include "dpa/selection.h"

namespace dpa {

// Where row (batch b, position s, head h) of a [.., s, h, d]-shaped tensor starts, in elements.
// Covers bshd, sbhd and thd (sequence b starts at row seq_start[b] of the packed t axis).
struct RowLayout {
  int64_t stride_batch = 0;  // 0 for thd
  int64_t stride_seq = 0;
  int64_t stride_head = 0;
  const int64_t* seq_start = nullptr;  // thd: per-batch first row; nullptr otherwise

  int64_t offset(int64_t b, int64_t s, int64_t h) const {
    int64_t row = seq_start ? seq_start[b] + s : s;
    return b * stride_batch + row * stride_seq + h * stride_head;
  }
};

// A [b|1, H|1, sq|1, skv|1]-broadcast tensor (bias, arbitrary mask, their gradients):
// broadcast dims have stride 0.
struct BroadcastLayout {
  int64_t stride_batch = 0, stride_head = 0, stride_q = 0, stride_kv = 0;
  // The strides of a 4-D tensor, 0 along its size-1 (broadcast) dims.
  static BroadcastLayout of(const TensorView& t) {
    BroadcastLayout layout;
    layout.stride_batch = t.shape[0] == 1 ? 0 : t.strides[0];
    layout.stride_head = t.shape[1] == 1 ? 0 : t.strides[1];
    layout.stride_q = t.shape[2] == 1 ? 0 : t.strides[2];
    layout.stride_kv = t.shape[3] == 1 ? 0 : t.strides[3];
    return layout;
  }
  int64_t offset(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return b * stride_batch + h * stride_head + i * stride_q + j * stride_kv;
  }
};

// One context-parallel tile (src/cp/tile.h, DESIGN.md §8): one (query block, key block) pair
// of a sharded sequence. Local row i of sequence b sits at position i + q_position[b] of the
// unsharded sequence, local key j at j + kv_position[b], and global_diagonal[b] is the delta of
// the unsharded pair. Visibility, ALiBi and dropout then use global coordinates (DESIGN.md
// §5). The defaults describe an ordinary call; only backends that declare
// Capabilities::cp_tiles accept a problem whose CpTile is active().
struct CpTile {
  std::vector<int64_t> q_position;       // [b]
  std::vector<int64_t> kv_position;      // [b]
  std::vector<int64_t> global_diagonal;  // [b]
  int64_t head_offset = 0;  // global index of local head 0 (a2a shards heads); dropout only
  int64_t heads_total = 0;  // global H for dropout's counter; 0 means heads_q
  // Forward: the partial softmax over this tile's keys only (no sink): o and LSE are partials
  // for the LSE merge, which adds the sink once afterwards.
  bool exclude_sink = false;
  // Backward: P = exp(s - LSE) with the given (final, merged, sink-included) lse instead of a
  // recomputed one; o is the final output, so D = rowsum(dO * o) is the final row's D.
  bool use_given_lse = false;
  // bias, attn_mask and dbias are the unsharded tensors: tile element (b, h, i, j) sits at
  // (b, h + head_offset, i + q_position[b], j + kv_position[b]) in them, and dbias (fp32)
  // accumulates across tiles instead of being overwritten.
  bool aux_global = false;
  // ... except that dbias is shaped like the tile instead: [b, H|1, sq|1, skv] of the tile's
  // own sizes and local positions, written (not accumulated); the caller places it (the GPU
  // tiles of CP with CUDA tensors, whose bias-gradient reduction writes that layout).
  bool dbias_local = false;

  bool active() const {
    return !global_diagonal.empty() || exclude_sink || use_given_lse || aux_global ||
           head_offset != 0 || heads_total != 0;
  }
};

// The most keys one query sees under a window bounded on both sides (left + right + 1, the
// diagonal included; a causal mask's right bound is 0), else -1. Saturates at INT64_MAX: bounds
// up to INT64_MAX are valid (and as good as unbounded).
constexpr int64_t window_span(int64_t window_left, int64_t window_right) {
  if (window_left < 0 || window_right < 0) return -1;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  return window_left > kMax - 1 - window_right ? kMax : window_left + window_right + 1;
}

struct AttentionProblem {
  Pass pass = Pass::kForward;
  Format format = Format::kBSHD;
  DType dtype = DType::kFloat32;  // of q, k, v, o, dO, dq, dk, dv
  Device device = Device::kCPU;
  int device_index = 0;
  int device_arch = 0;     // sm version (e.g. 90) of the device; 0 on the host
  void* stream = nullptr;  // cudaStream_t

  int64_t batch = 0;
  int64_t heads_q = 0;   // H
  int64_t heads_kv = 0;  // G; query head h reads KV head h / (H / G)
  int64_t head_dim_qk = 0;
  int64_t head_dim_v = 0;
  int64_t max_seqlen_q = 0;  // the s axis of bshd/sbhd; the longest sequence for thd
  int64_t max_seqlen_kv = 0;
  int64_t total_q = 0;                // thd: rows of the packed q tensor
  int64_t total_kv = 0;               // thd: rows of the packed k/v tensors
  std::vector<int64_t> seqlen_q;      // [b] each sequence's own length
  std::vector<int64_t> seqlen_kv;     // [b]
  std::vector<int64_t> seq_start_q;   // [b] thd only (empty otherwise)
  std::vector<int64_t> seq_start_kv;  // [b] thd only
  bool has_padded_offsets = false;    // thd with cu_seqlens_*_padded (gaps between sequences)

  // Features, resolved.
  double scale = 1.0;
  double softcap = 0.0;  // 0 = off
  int layer_number = 0;  // qk-layer-scaling factor when > 1
  MaskType mask_type = MaskType::kNoMask;
  int64_t window_left = -1;   // -1 unbounded
  int64_t window_right = -1;  // -1 unbounded; 0 for causal masks
  bool bottom_right = true;   // delta = skv_b - sq_b when true, else 0
  SoftmaxType softmax_type = SoftmaxType::kVanilla;
  BiasType bias_type = BiasType::kNoBias;
  bool has_alibi = false;
  bool has_attn_mask = false;
  double dropout = 0.0;  // effective for this call (0 when evaluating)
  uint32_t dropout_threshold = 0;
  double keep_prob = 1.0;
  RngState rng;
  bool deterministic = false;
  FlashForwardKernel flash_forward_kernel = FlashForwardKernel::kAuto;  // config's, for cuda_flash
  FlashBackwardKernel flash_backward_kernel = FlashBackwardKernel::kAuto;
  bool wants_dbias = false;
  bool wants_dsoftmax_offset = false;

  // Context parallelism: what makes this problem one CP tile (default: an ordinary call).
  CpTile cp;

  // Tensors. Layout objects locate rows; views carry the pointers and dtypes.
  TensorView q, k, v, o, lse, d_o, dq, dk, dv;
  RowLayout q_rows, k_rows, v_rows, o_rows, do_rows, dq_rows, dk_rows, dv_rows;
  TensorView bias, dbias, alibi_slopes, softmax_offset, dsoftmax_offset, attn_mask;
  BroadcastLayout bias_layout, dbias_layout, mask_layout;
  int64_t alibi_stride_batch = 0;  // 0 for [H] slopes, H for [b, H]

  // lse is contiguous: [b, H, sq] or (thd) [H, tq].
  int64_t lse_offset(int64_t b, int64_t h, int64_t i) const {
    if (format == Format::kTHD) return h * total_q + seq_start_q[b] + i;
    return (b * heads_q + h) * max_seqlen_q + i;
  }
  int64_t group_size() const { return heads_q / heads_kv; }
  // Whether every query (key) sequence fills its tensor's rows, so that the rows past a sequence
  // are past the tensor: bshd or sbhd with every length at the tensor's row count, whichever
  // the mask (cu_seqlens count with no_mask too). A padded sequence, or thd's packed ones, is
  // followed by rows of other data.
  bool queries_fill_rows() const { return lengths_fill_rows(seqlen_q, max_seqlen_q); }
  bool keys_fill_rows() const { return lengths_fill_rows(seqlen_kv, max_seqlen_kv); }
  bool lengths_fill_rows(const std::vector<int64_t>& lengths, int64_t rows) const {
    if (format == Format::kTHD) return false;
    for (int64_t length : lengths)
      if (length != rows) return false;
    return true;
  }
  int64_t kv_head(int64_t h) const { return h / group_size(); }
  int64_t window_span() const { return dpa::window_span(window_left, window_right); }
  // Offset of the diagonal for sequence b (bottom-right: skv - sq; top-left: 0).
  // For a CP tile: the unsharded delta, moved into local coordinates.
  int64_t diagonal_offset(int64_t b) const {
    if (!cp.global_diagonal.empty())
      return cp.q_position[b] - cp.kv_position[b] + cp.global_diagonal[b];
    return bottom_right ? seqlen_kv[b] - seqlen_q[b] : 0;
  }
  bool is_cp_tile() const { return cp.active(); }
  // Where tile element (b, h, i, j) sits in the unsharded problem (identity outside CP): the
  // coordinates dropout draws at.
  int64_t global_row(int64_t b, int64_t i) const {
    return cp.q_position.empty() ? i : i + cp.q_position[size_t(b)];
  }
  int64_t global_col(int64_t b, int64_t j) const {
    return cp.kv_position.empty() ? j : j + cp.kv_position[size_t(b)];
  }
  int64_t global_heads() const { return cp.heads_total > 0 ? cp.heads_total : heads_q; }
  // Offset of element (b, h, i, j) in a bias / mask / dbias tensor with layout `l`.
  int64_t aux_offset(const BroadcastLayout& l, int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (!cp.aux_global) return l.offset(b, h, i, j);
    return l.offset(b, h + cp.head_offset, i + cp.q_position[size_t(b)],
                    j + cp.kv_position[size_t(b)]);
  }
};

}  // namespace dpa
