// Test support: the KV-cache cases that the host suite (tests/api/test_kvcache.cc) and the GPU
// suite (tests/gpu/test_gpu_kvcache.cc) both run: contiguous and paged caches, page sizes 1 to
// 256, ragged and empty sequences, appends across page boundaries, packed (chunked-prefill)
// queries and appends, and every feature, each with a way to remove it (to show it moves the
// result).
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "support/kvcache_case.h"

namespace dpa::test {

struct KvCase {
  std::string name;
  std::function<void(KvCacheCaseSpec&)> configure;
  // Removes the case's feature (config and tensors); empty when the case tests no feature.
  std::function<void(KvCacheConfig&, KvCacheCase&)> without;
  // Adjusts the built case (views onto the same storage), before the call.
  std::function<void(KvCacheCaseSpec&, KvCacheCase&)> adjust;
};

inline void PrintTo(const KvCase& c, std::ostream* os) { *os << c.name; }

// A decode step: one query and one appended token per sequence, causal.
void decode_spec(KvCacheCaseSpec& s, std::vector<int64_t> cached, int64_t page_size);

const std::vector<KvCase>& kvcache_cases();

// The truth of a built case (o and lse from kvcache_reference under the spec's config) and, for a
// case that tests a feature, how far removing it moves o (relative error; -1 otherwise).
struct KvCaseTruth {
  HostTensor o, lse;
  double feature_effect = -1;
};
KvCaseTruth kvcache_truth(const KvCase& kv, const KvCacheCaseSpec& spec, const KvCacheCase& c);

// Rows of a packed q past its last sequence (cu_seqlens_q ends before q does). The spec: a
// decode and a 2-query chunk, packed, with learnable sinks. The build adds `extra` such rows to
// q and returns the truth with them as every call must leave them: o = 0 and the empty row's
// LSE (the sink's logit).
KvCacheCaseSpec rows_past_the_last_sequence_spec();
KvCaseTruth build_with_rows_past_the_last_sequence(const KvCacheCaseSpec& spec, int64_t extra,
                                                   KvCacheCase& c);

// The caches after a correct call: `k_before` / `v_before` with the appended slots holding the
// new tokens (the case's truth), every other element untouched.
void expected_caches(const KvCacheCaseSpec& spec, const KvCacheCase& c, HostTensor& k_before,
                     HostTensor& v_before);

}  // namespace dpa::test
