// KV-cache attention (dpa/kvcache.h) against the truth: each sequence run as an ordinary
// cpu_exact call over its keys (tests/support/kvcache_case.h). Contiguous and paged caches,
// page sizes 1 to 256, ragged and empty sequences, appends across page boundaries, packed
// (chunked-prefill) queries and appends, and every feature, each first shown to move the result.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <ostream>
#include <string>

#include "support/kvcache_case.h"

namespace dpa::test {
namespace {

struct KvCase {
  std::string name;
  std::function<void(KvCacheCaseSpec&)> configure;
  // Removes the case's feature (config and tensors); empty when the case tests no feature.
  std::function<void(KvCacheConfig&, KvCacheCase&)> without;
  // Adjusts the built case (views onto the same storage), before the call.
  std::function<void(KvCacheCaseSpec&, KvCacheCase&)> adjust;
};

void PrintTo(const KvCase& c, std::ostream* os) { *os << c.name; }

void decode(KvCacheCaseSpec& s, std::vector<int64_t> cached, int64_t page_size) {
  s.cached = std::move(cached);
  s.added.assign(s.cached.size(), 1);
  s.queries.assign(s.cached.size(), 1);
  s.page_size = page_size;
  s.config.causal = true;
}

void no_sinks(KvCacheConfig& config, KvCacheCase& c) {
  config.softmax_type = SoftmaxType::kVanilla;
  c.softmax_offset = HostTensor();
}

const KvCase kCases[] = {
    {"decode_contiguous",
     [](KvCacheCaseSpec& s) {
       decode(s, {37, 0, 64, 5}, 0);
     },
     {},
     {}},
    {"decode_page1",
     [](KvCacheCaseSpec& s) {
       decode(s, {9, 0, 4}, 1);
     },
     {},
     {}},
    {"decode_page16",
     [](KvCacheCaseSpec& s) {
       decode(s, {37, 0, 64, 5}, 16);
     },
     {},
     {}},
    {"decode_page64",
     [](KvCacheCaseSpec& s) {
       decode(s, {130, 63, 1}, 64);
     },
     {},
     {}},
    {"decode_page256",
     [](KvCacheCaseSpec& s) {
       decode(s, {300, 255, 0}, 256);
     },
     {},
     {}},
    {"no_append_empty_sequence",
     [](KvCacheCaseSpec& s) {
       s.cached = {0, 12, 3};
       s.added = {0, 0, 0};
       s.queries = {2, 2, 2};
       s.page_size = 4;
       s.config.causal = true;
     },
     {},
     {}},
    {"empty_sequence_with_sink",
     [](KvCacheCaseSpec& s) {
       s.cached = {0, 20};
       s.added = {0, 0};
       s.queries = {1, 1};
       s.config.softmax_type = SoftmaxType::kLearnable;
     },
     no_sinks,
     {}},
    {"prefill_chunk_across_pages",
     [](KvCacheCaseSpec& s) {
       s.cached = {13, 30, 0};
       s.added = {7, 7, 7};
       s.queries = {7, 7, 7};
       s.page_size = 16;
       s.config.causal = true;
     },
     {},
     {}},
    {"chunked_prefill_mixed_batch",  // prefill chunks and decodes in one packed call
     [](KvCacheCaseSpec& s) {
       s.cached = {40, 0, 9, 16};
       s.added = {1, 12, 5, 0};
       s.queries = {1, 12, 5, 3};
       s.packed_q = s.packed_new = true;
       s.page_size = 16;
       s.config.causal = true;
       s.config.softcap = 4.0;
       s.config.softmax_type = SoftmaxType::kLearnable;
       s.qk_stddev = 2.0;
     },
     [](KvCacheConfig& config, KvCacheCase&) { config.softcap = 0.0; },
     {}},
    {"packed_queries_contiguous_cache",  // read in place as a thd view with padded offsets
     [](KvCacheCaseSpec& s) {
       s.cached = {20, 3};
       s.added = {4, 4};
       s.queries = {4, 2};
       s.packed_q = true;
       s.config.causal = true;
     },
     {},
     {}},
    {"packed_queries_strided_cache",  // not packable in place: gathered
     [](KvCacheCaseSpec& s) {
       s.cached = {20, 3};
       s.added = {4, 4};
       s.queries = {4, 2};
       s.packed_q = true;
       s.capacity = 30;
       s.config.causal = true;
     },
     {},
     [](KvCacheCaseSpec&, KvCacheCase& c) {  // a view of positions 0..28 of a 30-slot cache
       c.k_cache.view().shape[1] -= 1;
       c.v_cache.view().shape[1] -= 1;
     }},
    {"packed_queries_one_slot_cache",  // s_max = 1: that dim's stride says nothing
     [](KvCacheCaseSpec& s) {
       s.cached = {0, 0, 0};
       s.added = {1, 1, 1};
       s.queries = {1, 1, 1};
       s.packed_q = true;
     },
     {},
     [](KvCacheCaseSpec&, KvCacheCase& c) {
       c.k_cache.view().strides[1] = 7;
       c.v_cache.view().strides[1] = 5;
     }},
    {"causal_rows_before_the_first_key",  // 5 queries over 2 keys: 3 rows see nothing
     [](KvCacheCaseSpec& s) {
       s.cached = {2, 0};
       s.added = {0, 0};
       s.queries = {5, 5};
       s.page_size = 2;
       s.config.causal = true;
       s.config.softmax_type = SoftmaxType::kOffByOne;
     },
     {},
     {}},
    {"paged_table_far_longer_than_used",  // only the used entries are read or kept
     [](KvCacheCaseSpec& s) {
       decode(s, {9, 2}, 4);
     },
     {},
     [](KvCacheCaseSpec&, KvCacheCase& c) { c.block_table.view().shape[1] = int64_t(1) << 40; }},
    {"window_inside_one_page",
     [](KvCacheCaseSpec& s) {
       decode(s, {100, 70}, 64);
       s.config.window_left = 7;
       s.config.window_right = 0;
     },
     [](KvCacheConfig& config, KvCacheCase&) { config.window_left = -1; },
     {}},
    {"window_prefill_chunk",
     [](KvCacheCaseSpec& s) {
       s.cached = {50, 10};
       s.added = {6, 6};
       s.queries = {6, 6};
       s.page_size = 8;
       s.config.causal = true;
       s.config.window_left = 4;
       s.config.window_right = 0;
     },
     [](KvCacheConfig& config, KvCacheCase&) { config.window_left = -1; },
     {}},
    {"sink_very_negative",  // the sink never wins: the plain softmax
     [](KvCacheCaseSpec& s) {
       decode(s, {30, 8}, 16);
       s.config.softmax_type = SoftmaxType::kLearnable;
       s.sink_mean = -40.0;
     },
     {},
     {}},
    {"sink_very_positive",  // the sink takes nearly all the weight: o near 0
     [](KvCacheCaseSpec& s) {
       decode(s, {30, 8}, 16);
       s.config.softmax_type = SoftmaxType::kLearnable;
       s.sink_mean = 12.0;
       s.sink_stddev = 0.5;
     },
     no_sinks,
     {}},
    {"off_by_one",
     [](KvCacheCaseSpec& s) {
       decode(s, {30, 8}, 16);
       s.config.softmax_type = SoftmaxType::kOffByOne;
       s.qk_stddev = 0.3;
     },
     [](KvCacheConfig& config, KvCacheCase&) { config.softmax_type = SoftmaxType::kVanilla; },
     {}},
    {"softcap",
     [](KvCacheCaseSpec& s) {
       decode(s, {45, 12}, 16);
       s.config.softcap = 2.0;
       s.qk_stddev = 3.0;
     },
     [](KvCacheConfig& config, KvCacheCase&) { config.softcap = 0.0; },
     {}},
    {"alibi",
     [](KvCacheCaseSpec& s) {
       decode(s, {45, 12}, 16);
       s.alibi = true;
     },
     [](KvCacheConfig&, KvCacheCase& c) { c.alibi_slopes = HostTensor(); },
     {}},
    {"non_causal_gqa_scale",
     [](KvCacheCaseSpec& s) {
       s.cached = {17, 5};
       s.added = {3, 3};
       s.queries = {3, 3};
       s.heads_q = 8;
       s.heads_kv = 2;
       s.page_size = 8;
       s.config.scale = 0.9;
     },
     [](KvCacheConfig& config, KvCacheCase&) { config.scale.reset(); },
     {}},
    {"gpt_oss_local_layer",  // GQA, sinks, softcap and a 16-token window over 16-token pages
     [](KvCacheCaseSpec& s) {
       decode(s, {90, 33, 7}, 16);
       s.heads_q = 8;
       s.heads_kv = 2;
       s.head_dim_qk = s.head_dim_v = 16;
       s.config.window_left = 15;
       s.config.window_right = 0;
       s.config.softmax_type = SoftmaxType::kLearnable;
       s.config.softcap = 5.0;
     },
     [](KvCacheConfig& config, KvCacheCase&) { config.window_left = -1; },
     {}},
    {"head_dim_v_differs",
     [](KvCacheCaseSpec& s) {
       decode(s, {21, 2}, 4);
       s.head_dim_v = 4;
     },
     {},
     {}},
};

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
  KvCacheCase c = make_kvcache_case(spec);
  if (kv.adjust) kv.adjust(spec, c);
  const double tol = backend == BackendKind::kCpuExact ? 1e-12 : 1e-6;

  HostTensor want_o = c.make_o(), want_lse = c.make_lse();
  kvcache_reference(spec, c, spec.config, want_o, want_lse);
  if (kv.without) {  // the feature moves the truth by far more than the tolerance
    KvCacheCase plain = c;
    KvCacheConfig config = spec.config;
    kv.without(config, plain);
    HostTensor plain_o = c.make_o(), plain_lse = c.make_lse();
    kvcache_reference(spec, plain, config, plain_o, plain_lse);
    ASSERT_GT(relative_error(plain_o, want_o), 1000 * tol);
  }

  const HostTensor k_before = c.k_cache, v_before = c.v_cache;
  const CallResult got = run(spec, c, backend);
  EXPECT_EQ(got.backend, backend);
  EXPECT_LE(relative_error(got.o, want_o), tol);
  EXPECT_LE(lse_error(got.lse, want_lse), tol);

  // The cache: the appended slots hold the new tokens, every other element is untouched.
  HostTensor want_k = k_before, want_v = v_before;
  const int64_t G = spec.heads_kv;
  for (size_t i = 0; i < spec.cached.size(); ++i)
    for (int64_t pos = spec.cached[i]; pos < spec.cached[i] + spec.added[i]; ++pos)
      for (int64_t h = 0; h < G; ++h) {
        for (int64_t e = 0; e < spec.head_dim_qk; ++e)
          want_k.set(cache_element(spec, c, int64_t(i), pos, h, spec.head_dim_qk) + e,
                     c.keys[i].get((pos * G + h) * spec.head_dim_qk + e));
        for (int64_t e = 0; e < spec.head_dim_v; ++e)
          want_v.set(cache_element(spec, c, int64_t(i), pos, h, spec.head_dim_v) + e,
                     c.values[i].get((pos * G + h) * spec.head_dim_v + e));
      }
  // Copies see the whole storage, also where the call was given a view of part of it.
  EXPECT_EQ(max_abs_error(HostTensor(c.k_cache), want_k), 0.0);
  EXPECT_EQ(max_abs_error(HostTensor(c.v_cache), want_v), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Cases, KvCacheMatchesReference,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(BackendKind::kCpuExact,
                                                              BackendKind::kCpu)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" +
                                  std::string(to_string(std::get<1>(info.param)));
                         });

TEST(KvCache, LseIsOptional) {
  KvCacheCaseSpec spec;
  decode(spec, {12, 3}, 4);
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
  decode(spec, {14, 1}, 4);
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
