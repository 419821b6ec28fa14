// A KV-cache call (dpa/kvcache.h) validated and resolved on the host: every sequence's cached,
// appended and query lengths, and where each of its cache positions lives. Built before
// anything is written, so that a bad call fails with nothing touched.
#pragma once

#include <cstdint>
#include <vector>

#include "dpa/kvcache.h"

namespace dpa {

struct KvCachePlan {
  int64_t batch = 0;
  int64_t heads_q = 0, heads_kv = 0, head_dim_qk = 0, head_dim_v = 0;
  bool packed_q = false;    // q is [tq, H, d] with cu_seqlens_q
  bool packed_new = false;  // k_new / v_new are [t_new, G, d] with cu_seqlens_k_new
  bool paged = false;
  Device device = Device::kCPU;  // every tensor's (q's device index too)
  int device_index = 0;
  // Whether the tables' contents were read and checked (always for host tensors); the vectors
  // below hold them only then, else only what the shapes give (4-D q_len and added).
  bool tables_read = false;
  int64_t page_size = 0;           // paged only
  int64_t capacity = 0;            // positions a sequence can hold: s_max, or max_pages * page_size
  std::vector<int64_t> cached;     // [b] cache_seqlens
  std::vector<int64_t> added;      // [b] new tokens this call appends
  std::vector<int64_t> new_start;  // [b] first row of sequence i in k_new (packed: its t row)
  std::vector<int64_t> q_len;      // [b] queries
  std::vector<int64_t> q_start;    // [b] first row of sequence i in a packed q
  // Paged only: the pages that hold each sequence's keys, in order; sequence i's begin at
  // pages[first_page[i]].
  std::vector<int64_t> pages;
  std::vector<int64_t> first_page;  // [b]
  // Every sequence's cached keys when the call has no cache_seqlens tensor (cuda_flash's decode
  // route with full-length sequences: no table to upload); -1: cache_seqlens holds them.
  int64_t uniform_cached = -1;

  int64_t keys(int64_t i) const { return cached[size_t(i)] + added[size_t(i)]; }
  int64_t max_keys() const;
  // Cache position `pos` of sequence i as (index along dim 0, index along dim 1) of k_cache /
  // v_cache: (page, row in page) when paged, (i, pos) otherwise.
  void slot(int64_t i, int64_t pos, int64_t* dim0, int64_t* dim1) const;
};

// Validates the arguments (DESIGN.md §7: each error names its argument) and reads the tables:
// always for host tensors, for device tensors only with config.check_tables. Device calls the
// KV-cache kernels cannot take (dtype, head dims, alignment) are refused with kNotSupported.
KvCachePlan plan_kvcache(const KvCacheArgs& args, const KvCacheConfig& config);

}  // namespace dpa
