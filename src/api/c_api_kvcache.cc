// The C ABI over KvCacheAttention (dpa/c_api.h).
#include <memory>

#include "api/c_api_support.h"
#include "dpa/c_api.h"
#include "dpa/kvcache.h"

struct dpa_kvcache_s {
  std::unique_ptr<dpa::KvCacheAttention> attention;
};

namespace {

using dpa::c_api::apply_call;
using dpa::c_api::guarded;
using dpa::c_api::to_view;

dpa::KvCacheConfig to_config(const dpa_kvcache_config_t* c) {
  dpa::require(c != nullptr, "config", "must not be NULL");
  dpa::require(c->size == sizeof(dpa_kvcache_config_t) && c->version == DPA_KVCACHE_CONFIG_VERSION,
               "config",
               "was not initialised with DPA_KVCACHE_CONFIG_INITIALIZER of this dpa version");
  dpa::require(c->backend >= -1 && c->backend <= 3, "backend", "is not a known backend");
  dpa::require(c->softmax_type >= 0 && c->softmax_type <= 2, "softmax_type",
               "is not a known softmax type");
  dpa::KvCacheConfig config;
  config.causal = c->causal != 0;
  config.window_left = c->window_left;
  config.window_right = c->window_right;
  config.softcap = c->softcap;
  if (c->scale != 0.0) config.scale = c->scale;
  config.softmax_type = static_cast<dpa::SoftmaxType>(c->softmax_type);
  config.backend = static_cast<dpa::BackendKind>(c->backend);
  return config;
}

dpa::KvCacheArgs to_args(const dpa_kvcache_inputs_t* in, dpa_tensor_t o, dpa_tensor_t lse) {
  dpa::require(in != nullptr, "inputs", "must not be NULL");
  dpa::KvCacheArgs args;
  args.q = to_view(in->q, "q");
  args.cu_seqlens_q = to_view(in->cu_seqlens_q, "cu_seqlens_q");
  args.k_cache = to_view(in->k_cache, "k_cache");
  args.v_cache = to_view(in->v_cache, "v_cache");
  args.block_table = to_view(in->block_table, "block_table");
  args.cache_seqlens = to_view(in->cache_seqlens, "cache_seqlens");
  args.k_new = to_view(in->k_new, "k_new");
  args.v_new = to_view(in->v_new, "v_new");
  args.cu_seqlens_k_new = to_view(in->cu_seqlens_k_new, "cu_seqlens_k_new");
  args.alibi_slopes = to_view(in->alibi_slopes, "alibi_slopes");
  args.softmax_offset = to_view(in->softmax_offset, "softmax_offset");
  args.o = to_view(o, "o");
  args.lse = to_view(lse, "lse");
  return args;
}

}  // namespace

extern "C" {

dpa_status_t dpa_kvcache_create(const dpa_kvcache_config_t* config, dpa_kvcache_t* out) {
  return guarded([&] {
    dpa::require(out != nullptr, "out", "must not be NULL");
    auto handle = std::make_unique<dpa_kvcache_s>();
    handle->attention = std::make_unique<dpa::KvCacheAttention>(to_config(config));
    *out = handle.release();
  });
}

dpa_status_t dpa_kvcache_destroy(dpa_kvcache_t kvcache) {
  return guarded([&] { delete kvcache; });
}

dpa_status_t dpa_kvcache_forward(dpa_kvcache_t kvcache, const dpa_kvcache_inputs_t* inputs,
                                 dpa_tensor_t o, dpa_tensor_t lse) {
  return dpa_kvcache_forward_ex(kvcache, inputs, o, lse, nullptr);
}

dpa_status_t dpa_kvcache_forward_ex(dpa_kvcache_t kvcache, const dpa_kvcache_inputs_t* inputs,
                                    dpa_tensor_t o, dpa_tensor_t lse, const dpa_call_t* call) {
  return guarded([&] {
    dpa::require(kvcache != nullptr && kvcache->attention != nullptr, "kvcache",
                 "is not a handle from dpa_kvcache_create");
    dpa::KvCacheArgs args = to_args(inputs, o, lse);
    apply_call(call, args.stream, args.workspace);
    kvcache->attention->forward(args);
  });
}

dpa_status_t dpa_kvcache_workspace_size(dpa_kvcache_t kvcache, const dpa_kvcache_inputs_t* inputs,
                                        dpa_tensor_t o, dpa_tensor_t lse, size_t* bytes) {
  return guarded([&] {
    dpa::require(kvcache != nullptr && kvcache->attention != nullptr, "kvcache",
                 "is not a handle from dpa_kvcache_create");
    dpa::require(bytes != nullptr, "bytes", "must not be NULL");
    *bytes = kvcache->attention->workspace_size(to_args(inputs, o, lse));
  });
}

}  // extern "C"
