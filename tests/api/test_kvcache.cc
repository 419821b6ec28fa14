// KV-cache attention (dpa/kvcache.h) against the truth: each sequence run as an ordinary
// cpu_exact call over its keys (tests/support/kvcache_case.h). Contiguous and paged caches,
// page sizes 1 to 256, ragged and empty sequences, appends across page boundaries, packed
// (chunked-prefill) queries and appends, and every feature, each first shown to move the result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <ostream>
#include <random>
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

// Drawn calls (a fixed seed): the cases above name one layout and feature each; these draw the
// layout (1-4 sequences of 0-70 cached tokens, 0-9 appended, 1-12 queries, padded or packed q
// and appends, a contiguous cache or pages of 1 to 256 rows, spare capacity), the heads and head
// dims, and every feature (causal, windows, softcap, sinks, ALiBi) independently, on both host
// backends, against the same truth, LSE and cache contents included. (Session 30 ran 2000 draws
// on each of seeds 1, 2 and 3: all passed.)
TEST(KvCacheRandomized, MatchesTheTruthOnDrawnCalls) {
  constexpr int kDraws = 150;
  std::mt19937 rng(20261204);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int draw = 0; draw < kDraws; ++draw) {
    KvCacheCaseSpec spec;
    spec.seed = uint64_t(500 + draw);
    spec.nan_past_sequences = true;
    const int sequences = pick(1, 4);
    spec.packed_q = pick(0, 2) == 0;
    spec.packed_new = spec.packed_q && pick(0, 1) == 1;
    const int64_t queries = pick(1, 12), added = pick(0, 9);
    for (int i = 0; i < sequences; ++i) {
      spec.cached.push_back(pick(0, 3) == 0 ? 0 : pick(1, 70));
      spec.queries.push_back(spec.packed_q ? pick(1, 12) : queries);
      spec.added.push_back(spec.packed_new ? pick(0, 9) : added);
    }
    spec.page_size = pick(0, 2) == 0 ? 0 : int64_t(1) << pick(0, 8);
    if (pick(0, 3) == 0) {
      int64_t longest = 0;
      for (int i = 0; i < sequences; ++i)
        longest = std::max(longest, spec.cached[size_t(i)] + spec.added[size_t(i)]);
      spec.capacity = longest + pick(1, 40);
    }
    spec.heads_kv = 1 << pick(0, 1);
    spec.heads_q = spec.heads_kv * (1 << pick(0, 2));
    spec.head_dim_qk = 8 * pick(1, 2);
    spec.head_dim_v = pick(0, 2) == 0 ? 8 : spec.head_dim_qk;
    KvCacheConfig& config = spec.config;
    config.causal = pick(0, 1) == 1;
    if (pick(0, 1)) {
      config.window_left = pick(0, 40);
      config.window_right = config.causal ? 0 : (pick(0, 2) == 0 ? -1 : pick(0, 10));
    }
    if (pick(0, 2) == 0) {  // logits of a few units, so that a cap of 2 bends them
      config.softcap = 2.0;
      config.scale = 1.0;
    }
    const int softmax = pick(0, 2);
    config.softmax_type = softmax == 0   ? SoftmaxType::kVanilla
                          : softmax == 1 ? SoftmaxType::kOffByOne
                                         : SoftmaxType::kLearnable;
    spec.alibi = pick(0, 3) == 0;
    std::string what =
        std::to_string(sequences) + " sequences, page " + std::to_string(spec.page_size) +
        (spec.packed_q ? ", packed q" : "") + (spec.packed_new ? ", packed appends" : "") +
        ", heads " + std::to_string(spec.heads_q) + "/" + std::to_string(spec.heads_kv) +
        (config.causal ? ", causal" : "") + ", window (" + std::to_string(config.window_left) +
        ", " + std::to_string(config.window_right) + "), softcap " +
        std::to_string(config.softcap) + ", softmax " + std::to_string(softmax) +
        (spec.alibi ? ", alibi" : "") + " (draw " + std::to_string(draw) + ")";
    for (BackendKind backend : {BackendKind::kCpuExact, BackendKind::kCpu}) {
      KvCacheCase c = make_kvcache_case(spec);
      KvCacheCase truth_case = c;
      HostTensor truth_o = c.make_o(), truth_lse = c.make_lse();
      kvcache_reference(spec, truth_case, spec.config, truth_o, truth_lse);
      const HostTensor k_before = c.k_cache, v_before = c.v_cache;
      CallResult got;
      try {
        got = run(spec, c, backend);
      } catch (const Error& error) {
        ADD_FAILURE() << what << ", " << to_string(backend) << ": refused: " << error.what();
        continue;
      }
      const double tol = backend == BackendKind::kCpuExact ? 1e-12 : 1e-6;
      EXPECT_LE(relative_error(got.o, truth_o), tol) << what << ", " << to_string(backend);
      EXPECT_LE(lse_error(got.lse, truth_lse), tol) << what << ", " << to_string(backend);
      HostTensor want_k = k_before, want_v = v_before;
      expected_caches(spec, c, want_k, want_v);
      EXPECT_TRUE(same_values(HostTensor(c.k_cache), want_k)) << what;
      EXPECT_TRUE(same_values(HostTensor(c.v_cache), want_v)) << what;
    }
  }
}

}  // namespace
}  // namespace dpa::test
