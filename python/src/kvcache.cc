// KV-cache attention from Python (dpa/kvcache.h, docs/kvcache.md): one object per config, its
// forward taking view tuples (or DLPack objects), None for an absent tensor.
#include "kvcache.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "attention_calls.h"
#include "dpa/kvcache.h"
#include "tensor_views.h"

namespace nb = nanobind;

namespace dpa::python {
namespace {

KvCacheConfig make_kvcache_config(bool causal, int64_t window_left, int64_t window_right,
                                  double softcap, std::optional<double> scale,
                                  const std::string& softmax_type, const std::string& backend) {
  KvCacheConfig config;
  config.causal = causal;
  config.window_left = window_left;
  config.window_right = window_right;
  config.softcap = softcap;
  config.scale = scale;
  config.softmax_type = parse_enum(parse_softmax_type, softmax_type, "softmax_type");
  config.backend = parse_enum(parse_backend, backend, "backend");
  return config;
}

class KvCache {
 public:
  explicit KvCache(const KvCacheConfig& config) : attention_(config) {}

  // Returns the name of the backend that ran.
  std::string forward(nb::handle q, nb::handle cu_seqlens_q, nb::handle k_cache, nb::handle v_cache,
                      nb::handle block_table, nb::handle cache_seqlens, nb::handle k_new,
                      nb::handle v_new, nb::handle cu_seqlens_k_new, nb::handle alibi_slopes,
                      nb::handle softmax_offset, nb::handle o, nb::handle lse, uintptr_t stream,
                      nb::handle allocate) {
    Keepalive keep;
    KvCacheArgs args;
    args.q = to_view(q, "q", keep);
    args.cu_seqlens_q = to_view(cu_seqlens_q, "cu_seqlens_q", keep);
    args.k_cache = to_view(k_cache, "k_cache", keep);
    args.v_cache = to_view(v_cache, "v_cache", keep);
    args.block_table = to_view(block_table, "block_table", keep);
    args.cache_seqlens = to_view(cache_seqlens, "cache_seqlens", keep);
    args.k_new = to_view(k_new, "k_new", keep);
    args.v_new = to_view(v_new, "v_new", keep);
    args.cu_seqlens_k_new = to_view(cu_seqlens_k_new, "cu_seqlens_k_new", keep);
    args.alibi_slopes = to_view(alibi_slopes, "alibi_slopes", keep);
    args.softmax_offset = to_view(softmax_offset, "softmax_offset", keep);
    args.o = to_view(o, "o", keep);
    args.lse = to_view(lse, "lse", keep);
    args.stream = reinterpret_cast<void*>(stream);
    args.workspace = workspace_of(allocate);
    BackendKind backend;
    {
      nb::gil_scoped_release release;
      backend = attention_.forward(args);
    }
    return std::string(to_string(backend));
  }

 private:
  KvCacheAttention attention_;
};

}  // namespace

void bind_kvcache(nb::module_& m) {
  nb::class_<KvCacheConfig>(m, "KvCacheConfig");
  m.def("make_kvcache_config", &make_kvcache_config, nb::arg("causal"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("softcap"), nb::arg("softmax_scale").none(),
        nb::arg("softmax_type"), nb::arg("backend"));
  nb::class_<KvCache>(m, "KvCache")
      .def(nb::init<const KvCacheConfig&>())
      .def("forward", &KvCache::forward, nb::arg("q"), nb::arg("cu_seqlens_q").none(),
           nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("block_table").none(),
           nb::arg("cache_seqlens"), nb::arg("k_new").none(), nb::arg("v_new").none(),
           nb::arg("cu_seqlens_k_new").none(), nb::arg("alibi_slopes").none(),
           nb::arg("softmax_offset").none(), nb::arg("o"), nb::arg("lse").none(), nb::arg("stream"),
           nb::arg("allocate").none());
}

}  // namespace dpa::python
