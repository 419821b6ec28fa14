#include "support/kvcache_cases.h"

#include <utility>

namespace dpa::test {

void decode_spec(KvCacheCaseSpec& s, std::vector<int64_t> cached, int64_t page_size) {
  s.cached = std::move(cached);
  s.added.assign(s.cached.size(), 1);
  s.queries.assign(s.cached.size(), 1);
  s.page_size = page_size;
  s.config.causal = true;
}

namespace {

void no_sinks(KvCacheConfig& config, KvCacheCase& c) {
  config.softmax_type = SoftmaxType::kVanilla;
  c.softmax_offset = HostTensor();
}

}  // namespace

const std::vector<KvCase>& kvcache_cases() {
  static const std::vector<KvCase> cases = {
      {"decode_contiguous",
       [](KvCacheCaseSpec& s) {
         decode_spec(s, {37, 0, 64, 5}, 0);
       },
       {},
       {}},
      {"decode_page1",
       [](KvCacheCaseSpec& s) {
         decode_spec(s, {9, 0, 4}, 1);
       },
       {},
       {}},
      {"decode_page16",
       [](KvCacheCaseSpec& s) {
         decode_spec(s, {37, 0, 64, 5}, 16);
       },
       {},
       {}},
      {"decode_page64",
       [](KvCacheCaseSpec& s) {
         decode_spec(s, {130, 63, 1}, 64);
       },
       {},
       {}},
      {"decode_page256",
       [](KvCacheCaseSpec& s) {
         decode_spec(s, {300, 255, 0}, 256);
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
         s.cached = {0, 5};
         s.added = {0, 0};
         s.queries = {1, 1};
         s.config.softmax_type = SoftmaxType::kLearnable;
         s.sink_mean = 2.0;  // the sink takes a large share of the 5-key row
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
         decode_spec(s, {9, 2}, 4);
       },
       {},
       [](KvCacheCaseSpec&, KvCacheCase& c) { c.block_table.view().shape[1] = int64_t(1) << 40; }},
      {"window_inside_one_page",
       [](KvCacheCaseSpec& s) {
         decode_spec(s, {100, 70}, 64);
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
         decode_spec(s, {30, 8}, 16);
         s.config.softmax_type = SoftmaxType::kLearnable;
         s.sink_mean = -40.0;
       },
       {},
       {}},
      {"sink_very_positive",  // the sink takes nearly all the weight: o near 0
       [](KvCacheCaseSpec& s) {
         decode_spec(s, {30, 8}, 16);
         s.config.softmax_type = SoftmaxType::kLearnable;
         s.sink_mean = 12.0;
         s.sink_stddev = 0.5;
       },
       no_sinks,
       {}},
      {"off_by_one",
       [](KvCacheCaseSpec& s) {
         decode_spec(s, {2, 1}, 16);  // few keys: the extra 1 in the sum weighs
         s.config.softmax_type = SoftmaxType::kOffByOne;
         s.qk_stddev = 0.3;
       },
       [](KvCacheConfig& config, KvCacheCase&) { config.softmax_type = SoftmaxType::kVanilla; },
       {}},
      {"softcap",
       [](KvCacheCaseSpec& s) {
         decode_spec(s, {45, 12}, 16);
         s.config.softcap = 2.0;
         s.qk_stddev = 3.0;
       },
       [](KvCacheConfig& config, KvCacheCase&) { config.softcap = 0.0; },
       {}},
      {"alibi",
       [](KvCacheCaseSpec& s) {
         decode_spec(s, {45, 12}, 16);
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
         decode_spec(s, {90, 33, 7}, 16);
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
         decode_spec(s, {21, 2}, 4);
         s.head_dim_v = 4;
       },
       {},
       {}},
  };
  return cases;
}

KvCaseTruth kvcache_truth(const KvCase& kv, const KvCacheCaseSpec& spec, const KvCacheCase& c) {
  KvCaseTruth truth{c.make_o(), c.make_lse()};
  kvcache_reference(spec, c, spec.config, truth.o, truth.lse);
  if (kv.without) {
    KvCacheCase plain = c;
    KvCacheConfig config = spec.config;
    kv.without(config, plain);
    HostTensor plain_o = c.make_o(), plain_lse = c.make_lse();
    kvcache_reference(spec, plain, config, plain_o, plain_lse);
    truth.feature_effect = relative_error(plain_o, truth.o);
  }
  return truth;
}

KvCacheCaseSpec rows_past_the_last_sequence_spec() {
  KvCacheCaseSpec spec;
  spec.cached = {20, 3};
  spec.added = {2, 2};
  spec.queries = {2, 1};
  spec.packed_q = spec.packed_new = true;
  spec.page_size = 4;
  spec.config.causal = true;
  spec.config.softmax_type = SoftmaxType::kLearnable;
  return spec;
}

KvCaseTruth build_with_rows_past_the_last_sequence(const KvCacheCaseSpec& spec, int64_t extra,
                                                   KvCacheCase& c) {
  c = make_kvcache_case(spec);
  std::vector<int64_t> shape = c.q.shape();
  const int64_t H = spec.heads_q, dv = spec.head_dim_v, row = shape[1] * shape[2];
  shape[0] += extra;
  HostTensor q(c.q.dtype(), shape);
  for (int64_t n = 0; n < c.q.numel(); ++n) q.set(n, c.q.get(n));
  for (int64_t n = c.q.numel(); n < q.numel(); ++n) q.set(n, 0.25 * double(n % row) - 1.0);
  c.q = q;
  KvCaseTruth truth = kvcache_truth(KvCase{}, spec, c);
  const int64_t rows = shape[0];
  for (int64_t t = rows - extra; t < rows; ++t)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t e = 0; e < dv; ++e) truth.o.set((t * H + h) * dv + e, 0.0);
      truth.lse.set(h * rows + t, c.softmax_offset.get(h));  // learnable sinks
    }
  return truth;
}

void expected_caches(const KvCacheCaseSpec& spec, const KvCacheCase& c, HostTensor& want_k,
                     HostTensor& want_v) {
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
}

}  // namespace dpa::test
