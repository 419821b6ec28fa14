#include "cuda/unfused/unfused_operands.h"

#include <climits>

#include "cuda/cuda_check.h"

namespace dpa::cuda {

GemmSource::GemmSource(const AttentionProblem& p, const TensorView& tensor, const RowLayout& layout,
                       bool query_side, int64_t heads, int64_t width, cudaStream_t stream)
    : data_(static_cast<const char*>(tensor.data)),
      element_bytes_(dtype_size(tensor.dtype)),
      layout_(layout) {
  const int64_t max_rows = query_side ? p.max_seqlen_q : p.max_seqlen_kv;
  // One row per matrix: the leading dimension is never stepped over, any value >= width works.
  if (max_rows <= 1) {
    ld_ = width;
    return;
  }
  if (!needs_packing(p, layout, query_side, width)) {
    ld_ = layout.stride_seq;
    return;
  }
  // Pack every stored row into [batches, rows, heads, width]; thd keeps its packed t axis
  // (batches = 1) so that seq_start still locates sequences.
  const bool thd = p.format == Format::kTHD;
  const int64_t batches = thd ? 1 : p.batch;
  const int64_t rows = thd ? (query_side ? p.total_q : p.total_kv) : max_rows;
  staging_ = DeviceBuffer(staging_bytes(p, tensor, layout, query_side, heads, width), stream);
  RowStrides source = row_strides(layout);
  if (thd) source.batch = 0;
  launch_pack_rows(tensor.data, source, staging_.get(), batches, rows, heads, width, element_bytes_,
                   stream);
  data_ = staging_.get<const char>();
  layout_.stride_batch = thd ? 0 : rows * heads * width;
  layout_.stride_seq = heads * width;
  layout_.stride_head = width;
  ld_ = heads * width;
}

bool GemmSource::needs_packing(const AttentionProblem& p, const RowLayout& layout, bool query_side,
                               int64_t width) {
  const int64_t max_rows = query_side ? p.max_seqlen_q : p.max_seqlen_kv;
  return max_rows > 1 && (layout.stride_seq < width || layout.stride_seq > INT_MAX);
}

size_t GemmSource::staging_bytes(const AttentionProblem& p, const TensorView& tensor,
                                 const RowLayout& layout, bool query_side, int64_t heads,
                                 int64_t width) {
  if (!needs_packing(p, layout, query_side, width)) return 0;
  const bool thd = p.format == Format::kTHD;
  const int64_t batches = thd ? 1 : p.batch;
  const int64_t rows =
      thd ? (query_side ? p.total_q : p.total_kv) : (query_side ? p.max_seqlen_q : p.max_seqlen_kv);
  return size_t(batches * rows * heads * width) * dtype_size(tensor.dtype);
}

const void* GemmSource::matrix(int64_t b, int64_t h) const {
  return data_ + layout_.offset(b, 0, h) * int64_t(element_bytes_);
}

size_t PointerTable::add(std::vector<const void*> pointers) {
  starts_.push_back(host_.size());
  host_.insert(host_.end(), pointers.begin(), pointers.end());
  return starts_.size() - 1;
}

void PointerTable::upload(cudaStream_t stream) { device_ = cuda::upload(host_, stream); }

const void* const* PointerTable::at(size_t section, int64_t first) const {
  return device_.get<const void*>() + starts_.at(section) + first;
}

void* const* PointerTable::writable_at(size_t section, int64_t first) const {
  // Stored as const void* on the host; output sections hold writable workspace pointers, and
  // both pointer types have one representation.
  return device_.get<void*>() + starts_.at(section) + first;
}

std::vector<SequenceGroup> sequence_groups(const AttentionProblem& p) {
  std::vector<SequenceGroup> groups;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t sq = p.seqlen_q[size_t(b)], skv = p.seqlen_kv[size_t(b)];
    if (sq == 0 || skv == 0) continue;
    // Consecutive sequences of equal lengths share one batched GEMM: their batch pointers are
    // adjacent in every section.
    if (!groups.empty()) {
      SequenceGroup& last = groups.back();
      if (last.first_batch + last.batches == b && last.seqlen_q == sq && last.seqlen_kv == skv) {
        ++last.batches;
        continue;
      }
    }
    groups.push_back({b, 1, sq, skv});
  }
  return groups;
}

ScoreGrid score_grid(const AttentionProblem& p, const int* seqlen_q, const int* seqlen_kv,
                     const int* start_q) {
  ScoreGrid grid;
  grid.batch = p.batch;
  grid.heads = p.heads_q;
  grid.max_seqlen_q = p.max_seqlen_q;
  grid.max_seqlen_kv = p.max_seqlen_kv;
  grid.seqlen_q = seqlen_q;
  grid.seqlen_kv = seqlen_kv;
  grid.start_q = start_q;
  return grid;
}

LogitTransform logit_transform(const AttentionProblem& p, const SequenceTables& tables) {
  LogitTransform t;
  t.scale = float(p.scale);
  t.softcap = float(p.softcap);
  t.window_left = p.window_left;
  t.window_right = p.window_right;
  t.bottom_right = p.bottom_right;
  t.bias_type = int(p.bias_type);
  if (p.bias_type != BiasType::kNoBias) {
    t.bias = p.bias.data;
    t.bias_dtype = p.bias.dtype;
    t.bias_strides = {p.bias_layout.stride_batch, p.bias_layout.stride_head, p.bias_layout.stride_q,
                      p.bias_layout.stride_kv};
  }
  if (p.has_alibi) {
    t.alibi_slopes = static_cast<const float*>(p.alibi_slopes.data);
    t.alibi_stride_batch = p.alibi_stride_batch;
  }
  if (p.has_attn_mask) {
    t.attn_mask = static_cast<const uint8_t*>(p.attn_mask.data);
    t.mask_strides = {p.mask_layout.stride_batch, p.mask_layout.stride_head, p.mask_layout.stride_q,
                      p.mask_layout.stride_kv};
  }
  t.softmax_type = int(p.softmax_type);
  if (p.softmax_type == SoftmaxType::kLearnable)
    t.softmax_offset = static_cast<const float*>(p.softmax_offset.data);
  t.dropout_threshold = p.dropout_threshold;
  t.dropout_scale = float(1.0 / p.keep_prob);
  t.seed = p.rng.seed;
  t.offset = p.rng.offset;
  t.diagonal = tables.diagonal;
  t.q_position = tables.q_position;
  t.kv_position = tables.kv_position;
  t.head_offset = p.cp.head_offset;
  t.heads_total = p.global_heads();
  t.aux_global = p.cp.aux_global;
  t.exclude_sink = p.cp.exclude_sink;
  return t;
}

RowStrides row_strides(const RowLayout& layout) {
  return {layout.stride_batch, layout.stride_seq, layout.stride_head};
}

}  // namespace dpa::cuda
