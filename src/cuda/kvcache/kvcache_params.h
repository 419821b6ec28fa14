// The parameter struct of the KV-cache kernels (docs/kvcache.md): raw pointers, element strides
// and the device-resident tables, passed by value. Host-includable.
//
// Sequence b has n_b queries and L_b = cache_seqlens[b] + added_b keys after the append. Its
// query i sits at position i + L_b - n_b (the bottom-right diagonal). A "packed row" of one KV
// head g is r = i * group + h (0 <= h < group): all query heads of a KV head share one tile, so
// each key is read once per step (GQA packing).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/fast_divider.h"

namespace dpa::cuda {

struct KvCacheParams {
  // Queries and outputs. Query i of sequence b is row start_q(b) + i, start_q(b) = cu_seqlens_q[b]
  // for a packed q (batch strides 0), else 0; an LSE entry is
  // lse[b * lse_batch_stride + head * lse_head_stride + start_q(b) + i].
  const void* q = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
  const int* cu_seqlens_q = nullptr;  // [b + 1] for a packed q; nullptr: queries_per_sequence
  int queries_per_sequence = 0;

  // The cache [dim0, dim1, G, d]: slot (b, pos) is (b, pos) when contiguous, (page, pos % page
  // size) when paged, page = block_table[b * block_table_stride + pos / page size].
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  int64_t k_dim0_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_dim0_stride = 0, v_row_stride = 0, v_head_stride = 0;
  const int* block_table = nullptr;  // nullptr: a contiguous cache
  int64_t block_table_stride = 0;
  int page_shift = 0;                  // log2 of the page size
  const int* cache_seqlens = nullptr;  // [b]; nullptr: every sequence holds cache_length
  int cache_length = 0;
  // TMA (sm_90): the caches as [dim0, dim1, G, d] tensors (cuda/tensor_map.h) whose boxes are
  // 64 columns by min(page size, 64) rows, one page each. Set only where such boxes can copy a
  // whole key tile (contiguous, or pages of at least 8 rows); the tile that crosses a
  // sequence's end is copied by cp.async, zero-filled, since the cache's rows past a sequence
  // are stale.
  CUtensorMap k_map{}, v_map{};
  bool tma = false;

  // The append: row r of sequence b's new tokens is new_row(b) + r, new_row(b) =
  // cu_seqlens_k_new[b] when packed (batch strides 0), else 0.
  const void* k_new = nullptr;  // nullptr: nothing appended
  const void* v_new = nullptr;
  int64_t k_new_batch_stride = 0, k_new_row_stride = 0, k_new_head_stride = 0;
  int64_t v_new_batch_stride = 0, v_new_row_stride = 0, v_new_head_stride = 0;
  const int* cu_seqlens_k_new = nullptr;  // [b + 1] for a packed append
  int new_per_sequence = 0;

  int batch = 0, heads_q = 0, heads_kv = 0, group = 1;
  // FastDivider(group): a packed row's query and head within the group without an integer
  // division (a short block of a windowed decode step divides several times per thread).
  FastDivider by_group;

  // Logits in log2 units, as FlashForwardParams: scale_log2 * (q.k), or
  // softcap_log2 * tanh(softcap_arg_scale * (q.k)).
  float scale_log2 = 0.f, softcap_arg_scale = 0.f, softcap_log2 = 0.f;
  bool use_softcap = false;
  // Visible keys of a query at position c: [c - window_left, c + window_right], -1 unbounded
  // (causal passes window_right = 0).
  int window_left = -1, window_right = -1;
  const float* alibi_slopes = nullptr;  // slope of head h: alibi_slopes[b * stride + h]
  int alibi_batch_stride = 0;
  int softmax_type = 0;  // 0 vanilla, 1 off-by-one, 2 learnable (softmax_offset[h])
  const float* softmax_offset = nullptr;

  // Split-KV: split s of num_splits covers its share of a tile's visible key tiles and writes
  // fp32 partials [split, T, H, dv] / [split, T, H] (T = total_rows, row t = partial_row(b, i):
  // cu_seqlens_q[b] + i when packed, b * queries_per_sequence + i otherwise; natural-log LSE, no
  // sink). With one split the kernel writes o and lse itself, the sink included.
  int num_splits = 1;
  int64_t total_rows = 0;
  float* partial_o = nullptr;
  float* partial_lse = nullptr;
};

}  // namespace dpa::cuda
