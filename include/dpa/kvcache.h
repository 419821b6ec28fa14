// Attention over a KV cache: decode and chunked prefill (docs/kvcache.md), in the style of
// FlashAttention's flash_attn_with_kvcache. The math is DESIGN.md §3's; what is new is where the
// keys live (a contiguous or a paged cache, with per-sequence lengths) and the append of this
// call's new keys and values before the attention reads them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "dpa/arguments.h"
#include "dpa/error.h"
#include "dpa/tensor.h"
#include "dpa/types.h"

namespace dpa {

struct KvCacheConfig {
  // Causal, aligned bottom-right: query r of a sequence with n queries and L keys (after the
  // append) sees keys j <= r + L - n, so the last query sees the whole cache.
  bool causal = false;
  // Sliding window (left, right), placed on the same bottom-right diagonal; -1 is unbounded.
  // With causal, right is 0.
  int64_t window_left = -1;
  int64_t window_right = -1;
  double softcap = 0.0;         // c * tanh(u / c); 0 disables it
  std::optional<double> scale;  // unset: 1 / sqrt(d)
  SoftmaxType softmax_type = SoftmaxType::kVanilla;
  // Force one backend; kAuto selects (DPA_BACKEND fills it at construction, as for
  // DotProductAttention).
  BackendKind backend = BackendKind::kAuto;
  // Device tensors: the tables' contents (cache_seqlens, block_table, cu_seqlens_*) are the
  // caller's contract, not read, so that a decode step never waits for the host. With this set
  // (or DPA_KVCACHE_CHECK_TABLES=1 at construction) they are copied to the host and checked as
  // for host tensors first: a debug mode. Host tensors are always checked.
  bool check_tables = false;
};

struct KvCacheArgs {
  // Queries: [b, sq, H, d], or packed [tq, H, d] with cu_seqlens_q (chunked prefill: one call
  // for a batch mixing prefill chunks and decodes).
  TensorView q;
  TensorView cu_seqlens_q;  // int32 [b + 1], with a 3-D q only
  // The cache. Contiguous: [b, s_max, G, d] and [b, s_max, G, dv]. Paged: [num_pages,
  // page_size, G, d] and [num_pages, page_size, G, dv] with block_table; page_size a power of
  // two from 1 to 256. The last dimension must be contiguous.
  TensorView k_cache;
  TensorView v_cache;
  // int32 [b, max_pages]: page p of sequence i holds its positions [p * page_size,
  // (p + 1) * page_size). Only the pages that cover a sequence's keys are read.
  TensorView block_table;
  // int32 [b]: the tokens each sequence holds in the cache before this call.
  TensorView cache_seqlens;
  // Optional new keys and values, written into the cache at positions cache_seqlens[i] onward
  // before the attention, which then sees them: [b, s_new, G, d] / [b, s_new, G, dv], or packed
  // [t_new, G, d] / [t_new, G, dv] with cu_seqlens_k_new. Both or neither.
  TensorView k_new;
  TensorView v_new;
  TensorView cu_seqlens_k_new;  // int32 [b + 1], with 3-D k_new / v_new only
  TensorView alibi_slopes;      // fp32 [H] or [b, H]; distances on the bottom-right diagonal
  TensorView softmax_offset;    // fp32 [H]; with softmax_type learnable (the sinks)
  // Outputs: o like q with dv; lse (optional) fp32 [b, H, sq], or [H, tq] for a packed q.
  TensorView o;
  TensorView lse;
  void* stream = nullptr;  // cudaStream_t for device tensors; nullptr is the default stream
  // Device scratch (the split partials) from the caller's allocator, as for DotProductAttention
  // (dpa/arguments.h); empty: stream-ordered memory from the driver's pool.
  Workspace workspace;
};

// The call object of one config, as DotProductAttention is for ordinary calls.
class KvCacheAttention {
 public:
  explicit KvCacheAttention(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }

  // Validates everything (shapes, the tables' contents, that the append fits and that no two
  // sequences write one cache slot or read one another's new slots), selects a backend, appends
  // k_new / v_new into the cache, and runs the attention. Throws dpa::Error; on error neither
  // the cache nor the outputs have been written. Returns the backend that ran.
  BackendKind forward(const KvCacheArgs& args);

  // The device workspace bytes forward(args) takes from a caller's block (0 for host tensors
  // and for calls of one split). Validates as forward would (the tables only in the debug
  // mode); writes nothing.
  size_t workspace_size(const KvCacheArgs& args) const;

 private:
  KvCacheConfig config_;
  // config_ as the attention's own config, with the environment applied at construction (the
  // format is set per call).
  AttentionConfig attention_;
};

}  // namespace dpa
