// Test support: a KV-cache call (dpa/kvcache.h) built from per-sequence lengths, with its truth:
// every sequence's keys and values as plain tensors, and a reference that runs each sequence as
// an ordinary cpu_exact call over them (no cache, no lengths, no pages).
#pragma once

#include <cstdint>
#include <vector>

#include "dpa/kvcache.h"
#include "support/host_tensor.h"

namespace dpa::test {

struct KvCacheCaseSpec {
  KvCacheConfig config;
  DType dtype = DType::kFloat64;
  int64_t heads_q = 4, heads_kv = 2, head_dim_qk = 8, head_dim_v = 8;
  std::vector<int64_t> cached;   // per sequence: tokens in the cache before the call
  std::vector<int64_t> added;    // per sequence: tokens appended (equal unless packed_new)
  std::vector<int64_t> queries;  // per sequence (equal unless packed_q)
  bool packed_q = false, packed_new = false;
  int64_t page_size = 0;  // 0: a contiguous cache
  int64_t capacity = 0;   // positions per sequence (0: the longest sequence)
  int64_t spare_pages = 3;
  bool alibi = false;
  double sink_mean = 0.0, sink_stddev = 2.0;  // learnable sinks
  double qk_stddev = 1.0;
  uint64_t seed = 1;
  // The cache's rows past each sequence's keys (up to its capacity, or the end of its last
  // page) are NaN rather than large garbage: a kernel that multiplies a masked key's P = 0 by
  // such a row, or copies it unmasked, writes NaN. Caches then compare with same_values().
  bool nan_past_sequences = false;
};

struct KvCacheCase {
  HostTensor q, cu_seqlens_q, k_cache, v_cache, block_table, cache_seqlens;
  HostTensor k_new, v_new, cu_seqlens_k_new, alibi_slopes, softmax_offset;
  // The truth: sequence i's keys and values after the append, [L_i, G, d] and [L_i, G, dv].
  std::vector<HostTensor> keys, values;
  std::vector<int64_t> q_start;  // first row of sequence i in a packed q

  HostTensor make_o() const;    // like q with dv, filled with a sentinel
  HostTensor make_lse() const;  // [b, H, sq] or [H, tq], filled with a sentinel
  KvCacheArgs args(HostTensor& o, HostTensor* lse) const;
};

KvCacheCase make_kvcache_case(const KvCacheCaseSpec& spec);

// o and lse (shaped as make_o / make_lse) from one cpu_exact call per sequence over keys[i],
// values[i], under `config` (the spec's unless given).
void kvcache_reference(const KvCacheCaseSpec& spec, const KvCacheCase& c,
                       const KvCacheConfig& config, HostTensor& o, HostTensor& lse);

// Where position `pos` of sequence i sits in the case's cache, as a flat element offset of
// (head h, channel 0) in k_cache (v_cache: pass its head dim).
int64_t cache_element(const KvCacheCaseSpec& spec, const KvCacheCase& c, int64_t i, int64_t pos,
                      int64_t h, int64_t head_dim);

}  // namespace dpa::test
