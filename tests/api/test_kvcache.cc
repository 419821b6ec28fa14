// KV-cache attention (dpa/kvcache.h) against the truth: each sequence run as an ordinary
// cpu_exact call over its keys (tests/support/kvcache_case.h). Contiguous and paged caches,
// page sizes 1 to 256, ragged and empty sequences, appends across page boundaries, packed
// (chunked-prefill) queries and appends, and every feature, each first shown to move the result.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <ostream>
#include <string>

#include "support/kvcache_cases.h"

namespace dpa::test {
namespace {

struct CallResult {
  HostTensor o, lse;
  BackendKind backend = BackendKind::kAuto;
};

CallResult run(const KvCacheCaseSpec& spec, KvCacheCase& c, BackendKind backend) {
  KvCacheConfig config = spec.config;
  config.backend = backend;
  CallResult out{c.make_o(), c.make_lse()};
  KvCacheAttention attention(config);
  out.backend = attention.forward(c.args(out.o, &out.lse));
  return out;
}

// Max |a - b| over finite entries; the non-finite ones (an empty row's -inf LSE) must agree.
double lse_error(const HostTensor& a, const HostTensor& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = b.get(i);
    if (std::isinf(x) || std::isinf(y)) {
      if (x != y) return INFINITY;
      continue;
    }
    worst = std::max(worst, std::fabs(x - y));
  }
  return worst;
}

class KvCacheMatchesReference : public ::testing::TestWithParam<std::tuple<KvCase, BackendKind>> {};

TEST_P(KvCacheMatchesReference, OutputLseAndCache) {
  const auto& [kv, backend] = GetParam();
  KvCacheCaseSpec spec;
  kv.configure(spec);
  spec.nan_past_sequences = true;
  KvCacheCase c = make_kvcache_case(spec);
  if (kv.adjust) kv.adjust(spec, c);
  const double tol = backend == BackendKind::kCpuExact ? 1e-12 : 1e-6;

  const KvCaseTruth truth = kvcache_truth(kv, spec, c);
  // The feature moves the truth by far more than the tolerance.
  if (kv.without) {
    ASSERT_GT(truth.feature_effect, 1000 * tol);
  }

  const HostTensor k_before = c.k_cache, v_before = c.v_cache;
  const CallResult got = run(spec, c, backend);
  EXPECT_EQ(got.backend, backend);
  EXPECT_LE(relative_error(got.o, truth.o), tol);
  EXPECT_LE(lse_error(got.lse, truth.lse), tol);

  // The cache: the appended slots hold the new tokens, every other element is untouched.
  HostTensor want_k = k_before, want_v = v_before;
  expected_caches(spec, c, want_k, want_v);
  // Copies see the whole storage, also where the call was given a view of part of it.
  EXPECT_TRUE(same_values(HostTensor(c.k_cache), want_k));
  EXPECT_TRUE(same_values(HostTensor(c.v_cache), want_v));
}

INSTANTIATE_TEST_SUITE_P(Cases, KvCacheMatchesReference,
                         ::testing::Combine(::testing::ValuesIn(kvcache_cases()),
                                            ::testing::Values(BackendKind::kCpuExact,
                                                              BackendKind::kCpu)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" +
                                  std::string(to_string(std::get<1>(info.param)));
                         });

// Rows of a packed q past its last sequence: o = 0 and the empty row's LSE, as in every call.
TEST(KvCache, RowsPastTheLastSequenceAreEmptyRows) {
  for (const BackendKind backend : {BackendKind::kCpuExact, BackendKind::kCpu}) {
    const KvCacheCaseSpec spec = rows_past_the_last_sequence_spec();
    KvCacheCase c;
    const KvCaseTruth truth = build_with_rows_past_the_last_sequence(spec, 3, c);
    const CallResult got = run(spec, c, backend);
    EXPECT_LE(relative_error(got.o, truth.o), 1e-6) << to_string(backend);
    EXPECT_LE(lse_error(got.lse, truth.lse), 1e-6) << to_string(backend);
  }
}

TEST(KvCache, HostCallsNeedNoWorkspace) {
  KvCacheCaseSpec spec;
  decode_spec(spec, {12, 3}, 4);
  KvCacheCase c = make_kvcache_case(spec);
  HostTensor o = c.make_o();
  EXPECT_EQ(KvCacheAttention(spec.config).workspace_size(c.args(o, nullptr)), 0u);
}

TEST(KvCache, LseIsOptional) {
  KvCacheCaseSpec spec;
  decode_spec(spec, {12, 3}, 4);
  KvCacheCase c = make_kvcache_case(spec);
  HostTensor want_o = c.make_o(), want_lse = c.make_lse();
  kvcache_reference(spec, c, spec.config, want_o, want_lse);
  HostTensor o = c.make_o();
  KvCacheAttention(spec.config).forward(c.args(o, nullptr));
  EXPECT_LE(relative_error(o, want_o), 1e-6);
}

TEST(KvCache, DecodeStepsGrowTheCache) {
  // Three decode steps on one paged cache: each appends one token and sees all before it.
  KvCacheCaseSpec spec;
  decode_spec(spec, {14, 1}, 4);
  spec.capacity = 20;
  spec.added = {3, 3};  // the truth holds all three steps' tokens
  KvCacheCase c = make_kvcache_case(spec);
  KvCacheAttention attention(spec.config);
  for (int64_t step = 0; step < 3; ++step) {
    KvCacheCaseSpec now = spec;
    now.added = {1, 1};
    for (size_t i = 0; i < now.cached.size(); ++i) now.cached[i] = spec.cached[i] + step;
    HostTensor k_new(spec.dtype, {2, 1, spec.heads_kv, spec.head_dim_qk});
    HostTensor v_new(spec.dtype, {2, 1, spec.heads_kv, spec.head_dim_v});
    for (int64_t i = 0; i < 2; ++i) {
      const int64_t pos = now.cached[size_t(i)], row = spec.heads_kv * spec.head_dim_qk;
      for (int64_t e = 0; e < row; ++e) {
        k_new.set(i * row + e, c.keys[size_t(i)].get(pos * row + e));
        v_new.set(i * row + e, c.values[size_t(i)].get(pos * row + e));
      }
    }
    HostTensor seqlens(DType::kInt32, {2});
    for (int64_t i = 0; i < 2; ++i) seqlens.set(i, double(now.cached[size_t(i)]));
    HostTensor o = c.make_o();
    KvCacheArgs args = c.args(o, nullptr);
    args.k_new = k_new.view();
    args.v_new = v_new.view();
    args.cache_seqlens = seqlens.view();
    attention.forward(args);

    // The truth of this step: the first cached + 1 keys of each sequence (the reference reads
    // keys_of(now) rows of the case's keys).
    HostTensor want_o = c.make_o(), want_lse = c.make_lse();
    kvcache_reference(now, c, spec.config, want_o, want_lse);
    EXPECT_LE(relative_error(o, want_o), 1e-6) << "step " << step;
  }
}

}  // namespace
}  // namespace dpa::test
