#include "attention_calls.h"

namespace nb = nanobind;

namespace dpa::python {

AttentionInputs make_inputs(nb::handle q, nb::handle k, nb::handle v, nb::handle cu_seqlens_q,
                            nb::handle cu_seqlens_kv, nb::handle cu_seqlens_q_padded,
                            nb::handle cu_seqlens_kv_padded, nb::handle bias,
                            nb::handle alibi_slopes, nb::handle softmax_offset,
                            nb::handle attn_mask, Keepalive& keep) {
  AttentionInputs in;
  in.q = to_view(q, "q", keep);
  in.k = to_view(k, "k", keep);
  in.v = to_view(v, "v", keep);
  in.cu_seqlens_q = to_view(cu_seqlens_q, "cu_seqlens_q", keep);
  in.cu_seqlens_kv = to_view(cu_seqlens_kv, "cu_seqlens_kv", keep);
  in.cu_seqlens_q_padded = to_view(cu_seqlens_q_padded, "cu_seqlens_q_padded", keep);
  in.cu_seqlens_kv_padded = to_view(cu_seqlens_kv_padded, "cu_seqlens_kv_padded", keep);
  in.bias = to_view(bias, "bias", keep);
  in.alibi_slopes = to_view(alibi_slopes, "alibi_slopes", keep);
  in.softmax_offset = to_view(softmax_offset, "softmax_offset", keep);
  in.attn_mask = to_view(attn_mask, "attn_mask", keep);
  return in;
}

std::optional<RngState> rng_of(const RngTuple& rng) {
  if (!rng) return std::nullopt;
  return RngState{std::get<0>(*rng), std::get<1>(*rng)};
}

Workspace workspace_of(nb::handle allocate) {
  Workspace workspace;
  if (allocate.is_none()) return workspace;
  // Borrowed, not owned: the caller's argument outlives the call, and the C++ side copies
  // ForwardArgs (with this function) where the GIL is released, so an owning nb::object would
  // touch a reference count without the GIL.
  workspace.allocate = [allocate](size_t bytes) -> void* {
    nb::gil_scoped_acquire gil;  // called from inside the call, where the GIL is released
    return reinterpret_cast<void*>(nb::cast<uintptr_t>(allocate(bytes)));
  };
  return workspace;
}

}  // namespace dpa::python
