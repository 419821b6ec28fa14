// dpa._dpa: the nanobind extension of the dpa Python package (DESIGN.md §11, docs/python.md).
// It binds the C++ API and nothing else: no libtorch, no framework types. Tensors arrive as
// view tuples or DLPack objects (tensor_views.h); CUDA streams as integers. The GIL is released
// while a backend runs.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attention_calls.h"
#include "context_parallel.h"
#include "core/workspace.h"
#include "dpa/attention.h"
#include "errors.h"
#include "kvcache.h"
#include "tensor_views.h"

namespace nb = nanobind;

namespace dpa::python {
namespace {

AttentionConfig make_config(const std::string& format, const std::string& mask_type,
                            int64_t window_left, int64_t window_right, bool bottom_right_diagonal,
                            double softcap, std::optional<double> scale,
                            const std::string& softmax_type, const std::string& bias_type,
                            double dropout, uint64_t seed, int layer_number, bool deterministic,
                            const std::string& backend) {
  AttentionConfig config;
  config.format = parse_enum(parse_format, format, "qkv_format");
  config.mask_type = parse_enum(parse_mask_type, mask_type, "mask_type");
  config.window_left = window_left;
  config.window_right = window_right;
  config.bottom_right_diagonal = bottom_right_diagonal;
  config.softcap = softcap;
  config.scale = scale;
  config.softmax_type = parse_enum(parse_softmax_type, softmax_type, "softmax_type");
  config.bias_type = parse_enum(parse_bias_type, bias_type, "bias_type");
  config.dropout = dropout;
  config.seed = seed;
  config.layer_number = layer_number;
  config.deterministic = deterministic;
  config.backend = parse_enum(parse_backend, backend, "backend");
  return config;
}

// (chosen backend or None, forced, [(backend, eligible, reasons, plan)])
using SelectionTuple =
    std::tuple<std::optional<std::string>, bool,
               std::vector<std::tuple<std::string, bool, std::vector<std::string>, std::string>>>;

SelectionTuple to_tuple(const Selection& selection) {
  SelectionTuple out;
  if (selection.chosen) std::get<0>(out) = std::string(to_string(*selection.chosen));
  std::get<1>(out) = selection.forced;
  for (const BackendVerdict& verdict : selection.verdicts)
    std::get<2>(out).emplace_back(std::string(to_string(verdict.backend)), verdict.eligible,
                                  verdict.reasons, verdict.plan);
  return out;
}

// The attention object of one config. The Python layer caches one per distinct config and
// always passes the dropout state, so the object's own offset counter is never used.
class Attention : public Calls<DotProductAttention> {
 public:
  explicit Attention(const AttentionConfig& config)
      : Calls(std::make_unique<DotProductAttention>(config)) {}

  SelectionTuple explain(nb::handle q, nb::handle k, nb::handle v, nb::handle cu_seqlens_q,
                         nb::handle cu_seqlens_kv, nb::handle cu_seqlens_q_padded,
                         nb::handle cu_seqlens_kv_padded, nb::handle bias, nb::handle alibi_slopes,
                         nb::handle softmax_offset, nb::handle attn_mask, bool backward,
                         bool wants_dbias, bool wants_dsoftmax_offset) const {
    Keepalive keep;
    AttentionInputs in =
        make_inputs(q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                    bias, alibi_slopes, softmax_offset, attn_mask, keep);
    return to_tuple(engine().explain(in, backward ? Pass::kBackward : Pass::kForward, wants_dbias,
                                     wants_dsoftmax_offset));
  }
};

}  // namespace

}  // namespace dpa::python

NB_MODULE(_dpa, m) {
  using namespace dpa::python;
  m.doc() = "dpa's C++ API (use the dpa package, not this module)";
  // The package caches one Attention per config for the life of the interpreter, so instances
  // alive at shutdown are by design, not a reference-counting bug.
  nb::set_leak_warnings(false);
  register_errors(m);

  // Opaque: built by make_config (names checked there) and validated by Attention's constructor.
  nb::class_<dpa::AttentionConfig>(m, "Config");
  m.def(
      "make_config",
      [](const std::string& qkv_format, const std::string& mask_type, int64_t window_left,
         int64_t window_right, bool bottom_right_diagonal, double softcap,
         std::optional<double> softmax_scale, const std::string& softmax_type,
         const std::string& bias_type, double dropout, uint64_t seed, int layer_number,
         bool deterministic, const std::string& backend) {
        return make_config(qkv_format, mask_type, window_left, window_right, bottom_right_diagonal,
                           softcap, softmax_scale, softmax_type, bias_type, dropout, seed,
                           layer_number, deterministic, backend);
      },
      nb::arg("qkv_format"), nb::arg("mask_type"), nb::arg("window_left"), nb::arg("window_right"),
      nb::arg("bottom_right_diagonal"), nb::arg("softcap"), nb::arg("softmax_scale").none(),
      nb::arg("softmax_type"), nb::arg("bias_type"), nb::arg("dropout"), nb::arg("seed"),
      nb::arg("layer_number"), nb::arg("deterministic"), nb::arg("backend"));

  nb::class_<Attention> attention(m, "Attention");
  attention.def(nb::init<const dpa::AttentionConfig&>());
  add_call_methods(attention);
  attention.def("explain", &Attention::explain, nb::arg("q"), nb::arg("k"), nb::arg("v"),
                nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_kv").none(),
                nb::arg("cu_seqlens_q_padded").none(), nb::arg("cu_seqlens_kv_padded").none(),
                nb::arg("bias").none(), nb::arg("alibi_slopes").none(),
                nb::arg("softmax_offset").none(), nb::arg("attn_mask").none(), nb::arg("backward"),
                nb::arg("wants_dbias"), nb::arg("wants_dsoftmax_offset"));

  m.def("workspace_shortfall_bytes", &dpa::workspace_shortfall_bytes,
        "Bytes that calls wanted beyond the workspace they were given (a sizing bug if not 0)");
  bind_context_parallel(m);
  bind_kvcache(m);
  m.def("cuda_built", []() {
#if defined(DPA_WITH_CUDA)
    return true;
#else
    return false;
#endif
  });
}
