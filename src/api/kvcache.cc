// KvCacheAttention: plan -> the attention's inputs -> select -> append -> gather -> backend.
// The attention itself is an ordinary call (core/problem.h) over per-sequence key lengths, so
// every backend and feature serves the cache: a contiguous cache is read in place, a paged one
// through a gathered copy of the pages that hold keys.
#include "dpa/kvcache.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "api/workspace_call.h"
#include "core/backend.h"
#include "core/environment.h"
#include "core/kvcache_plan.h"
#include "core/problem_builder.h"
#include "core/selector.h"
#if defined(DPA_WITH_CUDA)
#include "cuda/kvcache/kvcache_device.h"
#endif

namespace dpa {
namespace {

AttentionConfig attention_config(const KvCacheConfig& c) {
  AttentionConfig config;
  // Per-sequence lengths always come with the call; the diagonal is bottom-right, so that the
  // newest query sits against the newest key (FlashAttention's kvcache alignment).
  config.mask_type = c.causal ? MaskType::kPaddingCausalBottomRight : MaskType::kPadding;
  config.bottom_right_diagonal = true;
  config.window_left = c.window_left;
  config.window_right = c.window_right;
  config.softcap = c.softcap;
  config.scale = c.scale;
  config.softmax_type = c.softmax_type;
  config.backend = c.backend;
  return config;
}

TensorView int32_view(std::vector<int32_t>& values) {
  return TensorView::contiguous(values.data(), DType::kInt32, {int64_t(values.size())});
}

// The sequence tables the attention takes are int32, as the caller's are.
int32_t table_entry(int64_t value, const char* argument) {
  require(value <= std::numeric_limits<int32_t>::max(), argument, [&] {
    return "gives " + std::to_string(value) + " rows in all, beyond the int32 sequence tables";
  });
  return int32_t(value);
}

std::vector<int32_t> boundaries(const std::vector<int64_t>& lengths, const char* argument) {
  std::vector<int32_t> cu(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i)
    cu[i + 1] = table_entry(int64_t(cu[i]) + lengths[i], argument);
  return cu;
}

// The bytes of a gathered copy, refused (naming `argument`) where the product would not fit.
size_t buffer_bytes(std::initializer_list<int64_t> factors, const char* argument) {
  int64_t product = 1;
  for (int64_t factor : factors)
    require(!__builtin_mul_overflow(product, factor, &product), argument,
            "makes a gathered copy too large to address");
  return size_t(product);
}

char* element(const TensorView& t, int64_t offset) {
  return static_cast<char*>(t.data) + offset * int64_t(dtype_size(t.dtype));
}

// Where the attention reads the keys: the cache in place, or a gathered copy.
struct KeySource {
  TensorView k, v;
  std::vector<int32_t> cu_seqlens;         // key boundaries, one length per sequence
  std::vector<int32_t> cu_seqlens_padded;  // packed view of a contiguous cache: i * s_max
  std::vector<char> k_storage, v_storage;  // the gathered copy (paged caches)
  int64_t gathered_rows = 0;               // rows per sequence (4-D) or 0 (packed)
  bool gathered = false;
};

// The row stride of a contiguous cache read as packed rows [b * s_max, G, d] (row i * s_max + pos
// is position pos of sequence i), when its strides allow that view.
std::optional<int64_t> packed_row_stride(const TensorView& cache) {
  if (cache.shape[1] <= 1) return cache.strides[0];  // a size-1 dim's stride is arbitrary
  if (cache.strides[0] == cache.shape[1] * cache.strides[1]) return cache.strides[1];
  return std::nullopt;
}

KeySource key_source(const KvCachePlan& plan, const KvCacheArgs& a) {
  KeySource keys;
  std::vector<int64_t> lengths(size_t(plan.batch));
  for (int64_t i = 0; i < plan.batch; ++i) lengths[size_t(i)] = plan.keys(i);
  keys.cu_seqlens = boundaries(lengths, "cache_seqlens");
  const int64_t G = plan.heads_kv, esize = int64_t(dtype_size(a.q.dtype));
  if (!plan.paged && !plan.packed_q) {  // bshd over the cache itself
    keys.k = a.k_cache;
    keys.v = a.v_cache;
    return keys;
  }
  const std::optional<int64_t> k_rows = packed_row_stride(a.k_cache);
  const std::optional<int64_t> v_rows = packed_row_stride(a.v_cache);
  if (!plan.paged && k_rows && v_rows) {
    // thd over the cache itself: sequence i's slot starts at row i * s_max.
    const int64_t s_max = a.k_cache.shape[1];
    for (const auto& [view, cache, row_stride] : {std::make_tuple(&keys.k, &a.k_cache, *k_rows),
                                                  std::make_tuple(&keys.v, &a.v_cache, *v_rows)}) {
      *view = *cache;
      view->ndim = 3;
      view->shape = {plan.batch * s_max, cache->shape[2], cache->shape[3], 0, 0};
      view->strides = {row_stride, cache->strides[2], cache->strides[3], 0, 0};
    }
    keys.cu_seqlens_padded.resize(size_t(plan.batch + 1));
    for (int64_t i = 0; i <= plan.batch; ++i)
      keys.cu_seqlens_padded[size_t(i)] = table_entry(i * s_max, "k_cache");
    return keys;
  }
  // A gathered copy: [b, max keys, G, d] for a 4-D q, packed [sum of keys, G, d] for a packed one
  // (at least one row, so that the views have storage).
  keys.gathered = true;
  const int64_t rows = plan.packed_q ? keys.cu_seqlens.back() : plan.max_keys();
  const int64_t alloc_rows = std::max<int64_t>(rows, 1);
  const int64_t total_rows =
      plan.packed_q ? alloc_rows : int64_t(buffer_bytes({alloc_rows, plan.batch}, "cache_seqlens"));
  keys.k_storage.resize(buffer_bytes({total_rows, G, plan.head_dim_qk, esize}, "cache_seqlens"));
  keys.v_storage.resize(buffer_bytes({total_rows, G, plan.head_dim_v, esize}, "cache_seqlens"));
  keys.gathered_rows = plan.packed_q ? 0 : alloc_rows;
  if (plan.packed_q) {
    keys.k =
        TensorView::contiguous(keys.k_storage.data(), a.q.dtype, {alloc_rows, G, plan.head_dim_qk});
    keys.v =
        TensorView::contiguous(keys.v_storage.data(), a.q.dtype, {alloc_rows, G, plan.head_dim_v});
  } else {
    keys.k = TensorView::contiguous(keys.k_storage.data(), a.q.dtype,
                                    {plan.batch, alloc_rows, G, plan.head_dim_qk});
    keys.v = TensorView::contiguous(keys.v_storage.data(), a.q.dtype,
                                    {plan.batch, alloc_rows, G, plan.head_dim_v});
  }
  return keys;
}

// Element offset of (sequence i, cache position pos, head h) in k_cache / v_cache.
int64_t cache_offset(const KvCachePlan& plan, const TensorView& cache, int64_t i, int64_t pos,
                     int64_t h) {
  int64_t dim0 = 0, dim1 = 0;
  plan.slot(i, pos, &dim0, &dim1);
  return dim0 * cache.strides[0] + dim1 * cache.strides[1] + h * cache.strides[2];
}

// Writes k_new / v_new into the cache at positions cache_seqlens[i] onward.
void append(const KvCachePlan& plan, const KvCacheArgs& a) {
  if (!a.k_new.defined()) return;
  for (const auto& [fresh, cache] :
       {std::make_pair(&a.k_new, &a.k_cache), std::make_pair(&a.v_new, &a.v_cache)}) {
    const size_t bytes = size_t(cache->shape[3]) * dtype_size(cache->dtype);
    for (int64_t i = 0; i < plan.batch; ++i)
      for (int64_t r = 0; r < plan.added[size_t(i)]; ++r)
        for (int64_t h = 0; h < plan.heads_kv; ++h) {
          const int64_t source =
              plan.packed_new
                  ? (plan.new_start[size_t(i)] + r) * fresh->strides[0] + h * fresh->strides[1]
                  : i * fresh->strides[0] + r * fresh->strides[1] + h * fresh->strides[2];
          std::memcpy(element(*cache, cache_offset(plan, *cache, i, plan.cached[size_t(i)] + r, h)),
                      element(*fresh, source), bytes);
        }
  }
}

// Copies every sequence's keys and values (the append included) into the gathered views.
void gather(const KvCachePlan& plan, const KvCacheArgs& a, const KeySource& keys) {
  for (const auto& [view, cache] :
       {std::make_pair(&keys.k, &a.k_cache), std::make_pair(&keys.v, &a.v_cache)}) {
    const int64_t G = plan.heads_kv, d = cache->shape[3];
    const size_t bytes = size_t(d) * dtype_size(cache->dtype);
    for (int64_t i = 0; i < plan.batch; ++i) {
      const int64_t first_row = plan.packed_q ? keys.cu_seqlens[size_t(i)] : i * keys.gathered_rows;
      for (int64_t pos = 0; pos < plan.keys(i); ++pos)
        for (int64_t h = 0; h < G; ++h)
          std::memcpy(element(*view, ((first_row + pos) * G + h) * d),
                      element(*cache, cache_offset(plan, *cache, i, pos, h)), bytes);
    }
  }
}

// Device tensors run on the KV-cache kernels, which are cuda_flash's: what they cannot take on
// this device is refused before anything is written.
void refuse_what_the_device_kernels_lack(const KvCachePlan& plan, const KvCacheConfig& config) {
  if (config.backend != BackendKind::kAuto && config.backend != BackendKind::kCudaFlash)
    throw Error(ErrorCode::kNotSupported, "backend",
                std::string(to_string(config.backend)) +
                    " cannot serve a device KV cache: its kernels are cuda_flash's");
#if defined(DPA_WITH_CUDA)
  if (const std::optional<std::string> why = cuda::kvcache_device_refusal(plan))
    throw Error(ErrorCode::kNotSupported, "q", *why);
#else
  (void)plan;
  throw Error(ErrorCode::kNotSupported, "q", "is a device tensor, and this build has no CUDA");
#endif
}

BackendKind forward_on_device(const KvCachePlan& plan, const KvCacheConfig& config,
                              const KvCacheArgs& a) {
  refuse_what_the_device_kernels_lack(plan, config);
#if defined(DPA_WITH_CUDA)
  run_in_workspace(
      a.workspace, [&] { return cuda::kvcache_workspace_bytes(plan, config, a); },
      [&] { cuda::run_kvcache_on_device(plan, config, a); });
#else
  (void)a;
#endif
  return BackendKind::kCudaFlash;
}

bool check_tables_from(const EnvironmentGetter& getenv) {
  const char* value = getenv("DPA_KVCACHE_CHECK_TABLES");
  if (value == nullptr || *value == 0) return false;
  const std::string text(value);
  require(text == "0" || text == "1", "DPA_KVCACHE_CHECK_TABLES",
          [&] { return "must be 0 or 1, got '" + text + "'"; });
  return text == "1";
}

}  // namespace

KvCacheAttention::KvCacheAttention(const KvCacheConfig& config)
    : config_(config),
      attention_(config_with_environment(attention_config(config), process_environment())) {
  validate_config(attention_);
  config_.backend = attention_.backend;
  config_.check_tables = config_.check_tables || check_tables_from(process_environment());
}

size_t KvCacheAttention::workspace_size(const KvCacheArgs& a) const {
  const KvCachePlan plan = plan_kvcache(a, config_);
  if (plan.device != Device::kCUDA) return 0;
  refuse_what_the_device_kernels_lack(plan, config_);
#if defined(DPA_WITH_CUDA)
  return cuda::kvcache_workspace_bytes(plan, config_, a);
#else
  return 0;  // not reached: refused above
#endif
}

BackendKind KvCacheAttention::forward(const KvCacheArgs& a) {
  const KvCachePlan plan = plan_kvcache(a, config_);
  if (plan.device == Device::kCUDA) return forward_on_device(plan, config_, a);
  KeySource keys = key_source(plan, a);

  AttentionConfig config = attention_;
  config.format = plan.packed_q ? Format::kTHD : Format::kBSHD;
  std::vector<int32_t> cu_q = boundaries(plan.q_len, "q");
  std::vector<float> lse_storage;
  ForwardArgs args;
  args.in.q = a.q;
  args.in.k = keys.k;
  args.in.v = keys.v;
  args.in.cu_seqlens_q = plan.packed_q ? a.cu_seqlens_q : int32_view(cu_q);
  args.in.cu_seqlens_kv = int32_view(keys.cu_seqlens);
  if (!keys.cu_seqlens_padded.empty())
    args.in.cu_seqlens_kv_padded = int32_view(keys.cu_seqlens_padded);
  args.in.alibi_slopes = a.alibi_slopes;
  args.in.softmax_offset = a.softmax_offset;
  args.o = a.o;
  args.lse = a.lse;
  if (!a.lse.defined()) {
    const int64_t rows = plan.packed_q ? a.q.shape[0] : plan.batch * a.q.shape[1];
    lse_storage.resize(size_t(std::max<int64_t>(rows * plan.heads_q, 1)));
    args.lse = plan.packed_q ? TensorView::contiguous(lse_storage.data(), DType::kFloat32,
                                                      {plan.heads_q, a.q.shape[0]})
                             : TensorView::contiguous(lse_storage.data(), DType::kFloat32,
                                                      {plan.batch, plan.heads_q, a.q.shape[1]});
  }

  // Everything is validated and a backend chosen before the cache is written.
  AttentionProblem problem = build_forward_problem(config, args, 0.0, RngState{});
  const Backend& backend = choose_backend(config, problem, registered_backends());
  // Host backends take no workspace; a given one is still checked, as the ordinary call does.
  run_in_workspace(
      a.workspace, [] { return size_t(0); },
      [&] {
        append(plan, a);
        if (keys.gathered) gather(plan, a, keys);
        backend.forward(problem);
      });
  return backend.capabilities().kind;
}

}  // namespace dpa
