#include "support/kvcache_case.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include "dpa/attention.h"

namespace dpa::test {
namespace {

constexpr double kSentinel = 12345.0;

int64_t batch_of(const KvCacheCaseSpec& spec) { return int64_t(spec.cached.size()); }

int64_t keys_of(const KvCacheCaseSpec& spec, int64_t i) {
  return spec.cached[size_t(i)] + spec.added[size_t(i)];
}

int64_t capacity_of(const KvCacheCaseSpec& spec) {
  int64_t most = spec.capacity;
  for (int64_t i = 0; i < batch_of(spec); ++i) most = std::max(most, keys_of(spec, i));
  if (spec.page_size > 0) most = (most + spec.page_size - 1) / spec.page_size * spec.page_size;
  return std::max<int64_t>(most, 1);
}

int64_t sum(const std::vector<int64_t>& values) {
  return std::accumulate(values.begin(), values.end(), int64_t(0));
}

HostTensor boundaries(const std::vector<int64_t>& lengths) {
  HostTensor cu(DType::kInt32, {int64_t(lengths.size()) + 1});
  int64_t total = 0;
  cu.set(0, 0);
  for (size_t i = 0; i < lengths.size(); ++i) cu.set(int64_t(i) + 1, double(total += lengths[i]));
  return cu;
}

}  // namespace

int64_t cache_element(const KvCacheCaseSpec& spec, const KvCacheCase& c, int64_t i, int64_t pos,
                      int64_t h, int64_t head_dim) {
  const int64_t G = spec.heads_kv;
  if (spec.page_size == 0) return ((i * capacity_of(spec) + pos) * G + h) * head_dim;
  const int64_t max_pages = c.block_table.shape()[1];
  const int64_t page = int64_t(c.block_table.get(i * max_pages + pos / spec.page_size));
  return ((page * spec.page_size + pos % spec.page_size) * G + h) * head_dim;
}

KvCacheCase make_kvcache_case(const KvCacheCaseSpec& spec) {
  std::mt19937_64 rng(spec.seed);
  KvCacheCase c;
  const int64_t b = batch_of(spec), H = spec.heads_q, G = spec.heads_kv;
  const int64_t d = spec.head_dim_qk, dv = spec.head_dim_v, capacity = capacity_of(spec);

  for (int64_t i = 0; i < b; ++i) {
    c.keys.push_back(HostTensor::randn(spec.dtype, {keys_of(spec, i), G, d}, rng, spec.qk_stddev));
    c.values.push_back(HostTensor::randn(spec.dtype, {keys_of(spec, i), G, dv}, rng));
  }
  c.q_start.assign(size_t(b), 0);
  if (spec.packed_q) {
    c.q = HostTensor::randn(spec.dtype, {sum(spec.queries), H, d}, rng, spec.qk_stddev);
    c.cu_seqlens_q = boundaries(spec.queries);
    for (int64_t i = 0; i < b; ++i) c.q_start[size_t(i)] = int64_t(c.cu_seqlens_q.get(i));
  } else {
    c.q = HostTensor::randn(spec.dtype, {b, spec.queries.at(0), H, d}, rng, spec.qk_stddev);
  }

  // The cache, filled with large garbage first: a read outside a sequence's keys shows.
  if (spec.page_size == 0) {
    c.k_cache = HostTensor::randn(spec.dtype, {b, capacity, G, d}, rng, 100.0);
    c.v_cache = HostTensor::randn(spec.dtype, {b, capacity, G, dv}, rng, 100.0);
  } else {
    const int64_t max_pages = capacity / spec.page_size;
    const int64_t pool = b * max_pages + spec.spare_pages;
    c.k_cache = HostTensor::randn(spec.dtype, {pool, spec.page_size, G, d}, rng, 100.0);
    c.v_cache = HostTensor::randn(spec.dtype, {pool, spec.page_size, G, dv}, rng, 100.0);
    std::vector<int32_t> order(static_cast<size_t>(pool));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    c.block_table = HostTensor(DType::kInt32, {b, max_pages});
    for (int64_t i = 0; i < b; ++i) {
      const int64_t used = (keys_of(spec, i) + spec.page_size - 1) / spec.page_size;
      for (int64_t p = 0; p < max_pages; ++p)  // entries past the used pages are never read
        c.block_table.set(i * max_pages + p, p < used ? order[size_t(i * max_pages + p)] : -7);
    }
  }
  if (spec.nan_past_sequences) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (int64_t i = 0; i < b; ++i) {
      int64_t end = capacity;  // contiguous: the sequence's row; paged: its last used page
      if (spec.page_size > 0)
        end = (keys_of(spec, i) + spec.page_size - 1) / spec.page_size * spec.page_size;
      for (int64_t pos = keys_of(spec, i); pos < end; ++pos)
        for (int64_t h = 0; h < G; ++h) {
          for (int64_t e = 0; e < d; ++e)
            c.k_cache.set(cache_element(spec, c, i, pos, h, d) + e, nan);
          for (int64_t e = 0; e < dv; ++e)
            c.v_cache.set(cache_element(spec, c, i, pos, h, dv) + e, nan);
        }
    }
  }
  c.cache_seqlens = HostTensor(DType::kInt32, {b});
  for (int64_t i = 0; i < b; ++i) {
    c.cache_seqlens.set(i, double(spec.cached[size_t(i)]));
    for (int64_t pos = 0; pos < spec.cached[size_t(i)]; ++pos)
      for (int64_t h = 0; h < G; ++h) {
        for (int64_t e = 0; e < d; ++e)
          c.k_cache.set(cache_element(spec, c, i, pos, h, d) + e,
                        c.keys[size_t(i)].get((pos * G + h) * d + e));
        for (int64_t e = 0; e < dv; ++e)
          c.v_cache.set(cache_element(spec, c, i, pos, h, dv) + e,
                        c.values[size_t(i)].get((pos * G + h) * dv + e));
      }
  }

  // The new tokens: rows cached .. cached + added of the truth.
  if (sum(spec.added) > 0 || spec.packed_new) {
    std::vector<int64_t> rows_of(size_t(b), 0);
    if (spec.packed_new) {
      c.k_new = HostTensor(spec.dtype, {sum(spec.added), G, d});
      c.v_new = HostTensor(spec.dtype, {sum(spec.added), G, dv});
      c.cu_seqlens_k_new = boundaries(spec.added);
      for (int64_t i = 0; i < b; ++i) rows_of[size_t(i)] = int64_t(c.cu_seqlens_k_new.get(i));
    } else {
      c.k_new = HostTensor(spec.dtype, {b, spec.added.at(0), G, d});
      c.v_new = HostTensor(spec.dtype, {b, spec.added.at(0), G, dv});
      for (int64_t i = 0; i < b; ++i) rows_of[size_t(i)] = i * spec.added.at(0);
    }
    for (int64_t i = 0; i < b; ++i)
      for (int64_t r = 0; r < spec.added[size_t(i)]; ++r) {
        const int64_t truth = spec.cached[size_t(i)] + r, row = rows_of[size_t(i)] + r;
        for (int64_t e = 0; e < G * d; ++e)
          c.k_new.set(row * G * d + e, c.keys[size_t(i)].get(truth * G * d + e));
        for (int64_t e = 0; e < G * dv; ++e)
          c.v_new.set(row * G * dv + e, c.values[size_t(i)].get(truth * G * dv + e));
      }
  }

  if (spec.alibi) {
    c.alibi_slopes = HostTensor(DType::kFloat32, {H});
    for (int64_t h = 0; h < H; ++h) c.alibi_slopes.set(h, 0.5 / double(h + 1));
  }
  if (spec.config.softmax_type == SoftmaxType::kLearnable)
    c.softmax_offset =
        HostTensor::randn(DType::kFloat32, {H}, rng, spec.sink_stddev, spec.sink_mean);
  return c;
}

HostTensor KvCacheCase::make_o() const {
  std::vector<int64_t> shape = q.shape();
  shape.back() = values.empty() ? 0 : values[0].shape()[2];
  HostTensor o(q.dtype(), shape);
  o.fill(kSentinel);
  return o;
}

HostTensor KvCacheCase::make_lse() const {
  const bool packed = q.shape().size() == 3;
  const int64_t H = q.shape()[q.shape().size() - 2];
  HostTensor lse(DType::kFloat32, packed ? std::vector<int64_t>{H, q.shape()[0]}
                                         : std::vector<int64_t>{q.shape()[0], H, q.shape()[1]});
  lse.fill(kSentinel);
  return lse;
}

KvCacheArgs KvCacheCase::args(HostTensor& o, HostTensor* lse) const {
  KvCacheArgs a;
  a.q = q.view();
  if (cu_seqlens_q.defined()) a.cu_seqlens_q = cu_seqlens_q.view();
  a.k_cache = k_cache.view();
  a.v_cache = v_cache.view();
  if (block_table.defined()) a.block_table = block_table.view();
  a.cache_seqlens = cache_seqlens.view();
  if (k_new.defined()) {
    a.k_new = k_new.view();
    a.v_new = v_new.view();
  }
  if (cu_seqlens_k_new.defined()) a.cu_seqlens_k_new = cu_seqlens_k_new.view();
  if (alibi_slopes.defined()) a.alibi_slopes = alibi_slopes.view();
  if (softmax_offset.defined()) a.softmax_offset = softmax_offset.view();
  a.o = o.view();
  if (lse != nullptr) a.lse = lse->view();
  return a;
}

void kvcache_reference(const KvCacheCaseSpec& spec, const KvCacheCase& c,
                       const KvCacheConfig& config, HostTensor& o, HostTensor& lse) {
  const int64_t b = batch_of(spec), H = spec.heads_q, G = spec.heads_kv;
  const int64_t d = spec.head_dim_qk, dv = spec.head_dim_v;
  AttentionConfig reference;
  reference.mask_type = config.causal ? MaskType::kCausalBottomRight : MaskType::kNoMask;
  reference.bottom_right_diagonal = true;
  reference.window_left = config.window_left;
  reference.window_right = config.window_right;
  reference.softcap = config.softcap;
  reference.scale = config.scale;
  reference.softmax_type = config.softmax_type;
  reference.backend = BackendKind::kCpuExact;
  DotProductAttention attention(reference);
  const bool packed = spec.packed_q;
  const int64_t sq = packed ? 0 : c.q.shape()[1];
  auto q_row = [&](int64_t i, int64_t r) { return packed ? c.q_start[size_t(i)] + r : i * sq + r; };
  auto lse_at = [&](int64_t i, int64_t h, int64_t r) {
    return packed ? h * c.q.shape()[0] + c.q_start[size_t(i)] + r : (i * H + h) * sq + r;
  };
  for (int64_t i = 0; i < b; ++i) {
    const int64_t n = spec.queries[size_t(i)], keys = keys_of(spec, i);
    if (n == 0) continue;
    if (keys == 0) {  // no key: o is 0 and the LSE is the sink's alone (or -inf)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t e = 0; e < dv; ++e) o.set((q_row(i, r) * H + h) * dv + e, 0.0);
          double sink = -std::numeric_limits<double>::infinity();
          if (config.softmax_type == SoftmaxType::kOffByOne) sink = 0.0;
          if (config.softmax_type == SoftmaxType::kLearnable) sink = c.softmax_offset.get(h);
          lse.set(lse_at(i, h, r), sink);
        }
      continue;
    }
    HostTensor qi(spec.dtype, {1, n, H, d});
    for (int64_t e = 0; e < n * H * d; ++e) qi.set(e, c.q.get(q_row(i, 0) * H * d + e));
    HostTensor ki = c.keys[size_t(i)], vi = c.values[size_t(i)];
    ki.view().ndim = vi.view().ndim = 4;
    ki.view().shape = {1, keys, G, d, 0};
    ki.view().strides = {keys * G * d, G * d, d, 1, 0};
    vi.view().shape = {1, keys, G, dv, 0};
    vi.view().strides = {keys * G * dv, G * dv, dv, 1, 0};
    HostTensor oi(spec.dtype, {1, n, H, dv}), li(DType::kFloat32, {1, H, n});
    ForwardArgs args;
    args.in.q = qi.view();
    args.in.k = ki.view();
    args.in.v = vi.view();
    if (c.alibi_slopes.defined()) args.in.alibi_slopes = c.alibi_slopes.view();
    if (c.softmax_offset.defined()) args.in.softmax_offset = c.softmax_offset.view();
    args.o = oi.view();
    args.lse = li.view();
    attention.forward(args);
    for (int64_t e = 0; e < n * H * dv; ++e) o.set(q_row(i, 0) * H * dv + e, oi.get(e));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t r = 0; r < n; ++r) lse.set(lse_at(i, h, r), li.get(h * n + r));
  }
}

}  // namespace dpa::test
