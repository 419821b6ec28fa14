// The forward and backward calls as the extension binds them, shared by DotProductAttention and
// ContextParallelAttention: the same positional arguments (view tuples or DLPack objects, None
// for an absent tensor), the GIL released while the engine runs.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "dpa/attention.h"
#include "tensor_views.h"

namespace dpa::python {

using RngTuple = std::optional<std::tuple<uint64_t, uint64_t>>;

// A name -> enum parse (dpa/types.h's parsers) that raises naming `argument` when unknown.
template <typename T>
T parse_enum(std::optional<T> (*parse)(std::string_view), const std::string& name,
             const char* argument) {
  std::optional<T> value = parse(name);
  require(value.has_value(), argument, "has an unknown value '" + name + "'");
  return *value;
}

// The optional inputs, in the order every binding takes them after q, k, v.
AttentionInputs make_inputs(nanobind::handle q, nanobind::handle k, nanobind::handle v,
                            nanobind::handle cu_seqlens_q, nanobind::handle cu_seqlens_kv,
                            nanobind::handle cu_seqlens_q_padded,
                            nanobind::handle cu_seqlens_kv_padded, nanobind::handle bias,
                            nanobind::handle alibi_slopes, nanobind::handle softmax_offset,
                            nanobind::handle attn_mask, Keepalive& keep);
std::optional<RngState> rng_of(const RngTuple& rng);
// `allocate(bytes) -> data_ptr` (Python, e.g. torch.empty on the caller's stream) as the call's
// workspace allocator; None leaves the workspace empty (the driver's stream-ordered pool).
Workspace workspace_of(nanobind::handle allocate);

// forward / backward of an engine with DotProductAttention's call signatures.
template <typename Engine>
class Calls {
 public:
  explicit Calls(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {}

  // Returns the name of the backend that ran.
  std::string forward(nanobind::handle q, nanobind::handle k, nanobind::handle v,
                      nanobind::handle o, nanobind::handle lse, nanobind::handle cu_seqlens_q,
                      nanobind::handle cu_seqlens_kv, nanobind::handle cu_seqlens_q_padded,
                      nanobind::handle cu_seqlens_kv_padded, nanobind::handle bias,
                      nanobind::handle alibi_slopes, nanobind::handle softmax_offset,
                      nanobind::handle attn_mask, std::optional<double> dropout, RngTuple rng,
                      uintptr_t stream, nanobind::handle allocate) {
    Keepalive keep;
    ForwardArgs args;
    args.in =
        make_inputs(q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                    bias, alibi_slopes, softmax_offset, attn_mask, keep);
    args.o = to_view(o, "o", keep);
    args.lse = to_view(lse, "lse", keep);
    args.dropout = dropout;
    args.rng = rng_of(rng);
    args.stream = reinterpret_cast<void*>(stream);
    args.workspace = workspace_of(allocate);
    ForwardResult result;
    {
      nanobind::gil_scoped_release release;
      result = engine_->forward(args);
    }
    return std::string(to_string(result.backend));
  }

  std::string backward(nanobind::handle q, nanobind::handle k, nanobind::handle v,
                       nanobind::handle o, nanobind::handle lse, nanobind::handle d_o,
                       nanobind::handle dq, nanobind::handle dk, nanobind::handle dv,
                       nanobind::handle dbias, nanobind::handle dsoftmax_offset,
                       nanobind::handle cu_seqlens_q, nanobind::handle cu_seqlens_kv,
                       nanobind::handle cu_seqlens_q_padded, nanobind::handle cu_seqlens_kv_padded,
                       nanobind::handle bias, nanobind::handle alibi_slopes,
                       nanobind::handle softmax_offset, nanobind::handle attn_mask,
                       std::optional<double> dropout, RngTuple rng, uintptr_t stream,
                       nanobind::handle allocate) {
    Keepalive keep;
    BackwardArgs args;
    args.in =
        make_inputs(q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                    bias, alibi_slopes, softmax_offset, attn_mask, keep);
    args.o = to_view(o, "o", keep);
    args.lse = to_view(lse, "lse", keep);
    args.d_o = to_view(d_o, "d_o", keep);
    args.dq = to_view(dq, "dq", keep);
    args.dk = to_view(dk, "dk", keep);
    args.dv = to_view(dv, "dv", keep);
    args.dbias = to_view(dbias, "dbias", keep);
    args.dsoftmax_offset = to_view(dsoftmax_offset, "dsoftmax_offset", keep);
    args.dropout = dropout;
    args.rng = rng_of(rng);
    args.stream = reinterpret_cast<void*>(stream);
    args.workspace = workspace_of(allocate);
    BackendKind backend;
    {
      nanobind::gil_scoped_release release;
      backend = engine_->backward(args);
    }
    return std::string(to_string(backend));
  }

 protected:
  Engine& engine() const { return *engine_; }
  void reset(std::unique_ptr<Engine> engine) { engine_ = std::move(engine); }

 private:
  std::unique_ptr<Engine> engine_;
};

// Binds forward and backward with their argument names.
template <typename T>
void add_call_methods(nanobind::class_<T>& cls) {
  namespace nb = nanobind;
  cls.def("forward", &T::forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"),
          nb::arg("lse"), nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_kv").none(),
          nb::arg("cu_seqlens_q_padded").none(), nb::arg("cu_seqlens_kv_padded").none(),
          nb::arg("bias").none(), nb::arg("alibi_slopes").none(), nb::arg("softmax_offset").none(),
          nb::arg("attn_mask").none(), nb::arg("dropout").none(), nb::arg("rng").none(),
          nb::arg("stream"), nb::arg("allocate").none());
  cls.def("backward", &T::backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"),
          nb::arg("lse"), nb::arg("d_o"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
          nb::arg("dbias").none(), nb::arg("dsoftmax_offset").none(),
          nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_kv").none(),
          nb::arg("cu_seqlens_q_padded").none(), nb::arg("cu_seqlens_kv_padded").none(),
          nb::arg("bias").none(), nb::arg("alibi_slopes").none(), nb::arg("softmax_offset").none(),
          nb::arg("attn_mask").none(), nb::arg("dropout").none(), nb::arg("rng").none(),
          nb::arg("stream"), nb::arg("allocate").none());
}

}  // namespace dpa::python
