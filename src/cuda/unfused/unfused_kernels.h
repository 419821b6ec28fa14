// The elementwise kernels of the unfused backend and their plain parameter structs (raw
// pointers, int64 strides, flags; passed to kernels by value). Host code fills them from the
// AttentionProblem; no CUDA device code here.
//
// Shapes: the score workspaces are [b, H, sq_max, skv_max] (row (b, h, i) starts at
// ((b * H + h) * sq_max + i) * skv_max); a sequence shorter than the maximum uses the top-left
// [sq_b, skv_b] corner of its block. Positions i, j are within sequence b (DESIGN.md §2).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dpa/types.h"

namespace dpa::cuda {

// Where each sequence sits inside the score grid.
struct ScoreGrid {
  int64_t batch = 0, heads = 0;  // heads = H (query heads)
  int64_t max_seqlen_q = 0, max_seqlen_kv = 0;
  const int* seqlen_q = nullptr;   // [b] device
  const int* seqlen_kv = nullptr;  // [b] device
  const int* start_q = nullptr;    // [b] device: first packed row of sequence b (thd), else 0
};

// Strides of a [b|1, H|1, sq|1, skv]-broadcast tensor (stride 0 on broadcast dims).
struct BroadcastStrides {
  int64_t batch = 0, head = 0, q = 0, kv = 0;
};

// Strides of a [.., s, heads, d] row tensor; row (b, i, h) of sequence b starts at
// b * batch + (start[b] + i) * seq + h * head.
struct RowStrides {
  int64_t batch = 0, seq = 0, head = 0;
};

// The per-element rules of DESIGN.md §3 and §5, applied to a raw q.k from the first GEMM.
struct LogitTransform {
  float scale = 1.f;
  float softcap = 0.f;                          // 0: off
  int64_t window_left = -1, window_right = -1;  // -1: unbounded
  bool bottom_right = true;
  int bias_type = 0;  // BiasType
  const void* bias = nullptr;
  DType bias_dtype = DType::kFloat32;
  BroadcastStrides bias_strides;
  const float* alibi_slopes = nullptr;  // [H] or [b, H]; nullptr: no ALiBi
  int64_t alibi_stride_batch = 0;
  const uint8_t* attn_mask = nullptr;  // bool, true = masked; nullptr: no arbitrary mask
  BroadcastStrides mask_strides;
  int softmax_type = 0;                   // SoftmaxType
  const float* softmax_offset = nullptr;  // [H] alpha_h (learnable)
  uint32_t dropout_threshold = 0;         // 0: no dropout
  float dropout_scale = 1.f;              // 1 / keep_prob
  uint64_t seed = 0, offset = 0;
  // Per-sequence tables on the device (SequenceTables): the diagonal offset, and a CP tile's
  // first row / key in the unsharded sequence (0 outside CP).
  const int* diagonal = nullptr;
  const int* q_position = nullptr;
  const int* kv_position = nullptr;
  // CP tiles (AttentionProblem::cp_*): dropout draws at the global head among heads_total;
  // bias and mask are the unsharded tensors (aux_global); the forward partial leaves the sink
  // out.
  int64_t head_offset = 0, heads_total = 0;
  bool aux_global = false;
  bool exclude_sink = false;
};

struct SoftmaxForwardParams {
  ScoreGrid grid;
  LogitTransform logits;
  const float* scores = nullptr;  // [b, H, sq_max, skv_max] raw q.k
  void* probs = nullptr;          // [b, H, sq_max, skv_max] dtype: Pd = P * keep / keep_prob
  float* lse = nullptr;           // [b, H, sq_max], thd [H, total_q]
  bool lse_packed = false;        // thd layout
  int64_t lse_total_q = 0;        // thd: rows of the packed q tensor
};

struct SoftmaxBackwardParams {
  ScoreGrid grid;
  LogitTransform logits;
  const float* scores = nullptr;  // [b, H, sq_max, skv_max] raw q.k
  // [b, H, sq_max, skv_max]: in, dO . v; out (wants_dbias), the bias gradient per element
  // (post_scale: dS, pre_scale: scale * dU), 0 outside every sequence.
  float* dprobs = nullptr;
  void* probs = nullptr;      // out [b, H, sq_max, skv_max] dtype: Pd
  void* dlogits = nullptr;    // out [b, H, sq_max, skv_max] dtype: dU
  const void* o = nullptr;    // [.., sq, H, dv] dtype
  const void* d_o = nullptr;  // [.., sq, H, dv] dtype
  RowStrides o_rows, do_rows;
  int64_t head_dim_v = 0;
  bool wants_dbias = false;
  bool dbias_pre_scale = false;
  float* row_dalpha = nullptr;  // out [b, H, sq_max]: -exp(alpha_h - LSE_i) * D_i; nullable
  // A CP tile's backward normalises by the given final LSE (every key and the sink) instead
  // of the tile's own softmax statistics: lse [b, H, sq_max] (or thd [H, total_q]).
  const float* given_lse = nullptr;
  bool lse_packed = false;
  int64_t lse_total_q = 0;
};

// One block per score row. `dtype` is the storage dtype of probs/dlogits/o/d_o (f16, bf16, f32).
void launch_softmax_forward(const SoftmaxForwardParams& params, DType dtype, cudaStream_t stream);
void launch_softmax_backward(const SoftmaxBackwardParams& params, DType dtype, cudaStream_t stream);

// Copies every stored row of a strided [batches, rows, heads, width] tensor into a contiguous
// one of the same shape (the GEMM fallback for strides cuBLAS cannot take). 2- or 4-byte dtype.
void launch_pack_rows(const void* source, RowStrides source_strides, void* destination,
                      int64_t batches, int64_t rows, int64_t heads, int64_t width,
                      size_t element_bytes, cudaStream_t stream);

// Converts an fp32 workspace [b, heads, max_rows, width] into the strided output rows that lie
// inside sequences (rows i < seqlen[b]); other rows are left alone (zeroed beforehand).
void launch_store_rows(const float* workspace, int64_t batch, int64_t heads, int64_t max_rows,
                       int64_t width, const int* seqlen, const int* start, void* output,
                       RowStrides output_strides, DType dtype, cudaStream_t stream);

// dbias [bias_batch, bias_heads, bias_rows, skv_max] (contiguous, dtype of the bias) = the
// per-element gradients [b, H, sq_max, skv_max] summed over the broadcast dims, in a fixed
// order (deterministic), accumulated in fp64.
void launch_reduce_dbias(const float* gradients, int64_t batch, int64_t heads, int64_t max_seqlen_q,
                         int64_t max_seqlen_kv, int64_t bias_batch, int64_t bias_heads,
                         int64_t bias_rows, void* dbias, DType dbias_dtype, cudaStream_t stream);

// dalpha[h] = sum over b, i of row_dalpha [b, H, sq_max], in a fixed order, fp64 accumulation.
void launch_reduce_dalpha(const float* row_dalpha, int64_t batch, int64_t heads,
                          int64_t max_seqlen_q, float* dalpha, cudaStream_t stream);

}  // namespace dpa::cuda
