#include "core/memory_overlap.h"

#include <algorithm>
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "dpa/error.h"

namespace dpa {
namespace {

// The inputs every call reads; a backward also reads o, lse and d_o.
constexpr size_t kInputs = 11;
std::array<NamedView, kInputs + 3> inputs_of(const AttentionInputs& in) {
  return {{{&in.q, "q"},
           {&in.k, "k"},
           {&in.v, "v"},
           {&in.cu_seqlens_q, "cu_seqlens_q"},
           {&in.cu_seqlens_kv, "cu_seqlens_kv"},
           {&in.cu_seqlens_q_padded, "cu_seqlens_q_padded"},
           {&in.cu_seqlens_kv_padded, "cu_seqlens_kv_padded"},
           {&in.bias, "bias"},
           {&in.alibi_slopes, "alibi_slopes"},
           {&in.softmax_offset, "softmax_offset"},
           {&in.attn_mask, "attn_mask"}}};
}

// Each output free of repeats and apart from every input and from the outputs before it; the
// workspace block apart from all of them.
void require_apart_from_inputs(std::span<const NamedView> outputs,
                               std::span<const NamedView> inputs, const Workspace& workspace) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [out, out_name] = outputs[i];
    require_no_repeated_elements(*out, out_name);
    for (const auto& [in, in_name] : inputs) require_apart(*out, out_name, *in, in_name);
    for (size_t j = 0; j < i; ++j)
      require_apart(*out, out_name, *outputs[j].first, outputs[j].second);
  }
  require_workspace_apart(workspace, inputs);
  require_workspace_apart(workspace, outputs);
}

// A view with data and at least one element.
bool has_elements(const TensorView& t) {
  if (t.data == nullptr || t.ndim <= 0 || t.ndim > kMaxDims) return false;
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[size_t(d)] <= 0) return false;
  return true;
}

}  // namespace

ByteRange byte_range(const TensorView& t) {
  if (t.data == nullptr || t.ndim <= 0 || t.ndim > kMaxDims) return {};
  // Byte offsets of the lowest and the highest element from the first; a view whose offsets
  // overflow 64 bits spans no memory a process has, and is left undecided (empty).
  const auto size = int64_t(dtype_size(t.dtype));
  int64_t low = 0, high = 0;
  for (int d = 0; d < t.ndim; ++d) {
    const int64_t extent = t.shape[size_t(d)];
    int64_t step = 0;
    if (extent <= 0) return {};
    if (__builtin_mul_overflow(extent - 1, t.strides[size_t(d)], &step) ||
        __builtin_mul_overflow(step, size, &step) ||
        __builtin_add_overflow(step < 0 ? low : high, step, step < 0 ? &low : &high))
      return {};
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data);
  return {base + uintptr_t(low), base + uintptr_t(high) + uintptr_t(size)};
}

bool is_dense(const TensorView& t) {
  if (t.ndim <= 0 || t.ndim > kMaxDims) return false;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, extent) of extents above 1
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[size_t(d)] <= 0) return false;
    if (t.shape[size_t(d)] > 1) dims.emplace_back(t.strides[size_t(d)], t.shape[size_t(d)]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, extent] : dims) {
    if (stride != expected) return false;
    expected *= extent;
  }
  return true;
}

bool provably_share_memory(const TensorView& a, const TensorView& b) {
  if (a.device != b.device || (a.device == Device::kCUDA && a.device_index != b.device_index))
    return false;
  if (!has_elements(a) || !has_elements(b)) return false;
  return a.data == b.data ||
         (byte_range(a).intersects(byte_range(b)) && is_dense(a) && is_dense(b));
}

void require_no_repeated_elements(const TensorView& out, const char* name) {
  if (!has_elements(out)) return;  // an extent of 0 makes strides of 0
  for (int d = 0; d < out.ndim; ++d)
    require(out.shape[size_t(d)] <= 1 || out.strides[size_t(d)] != 0, name, [&] {
      return "has stride 0 in dimension " + std::to_string(d) + " of " + out.shape_string() +
             ": its elements there are one, which the call would write more than once";
    });
}

void require_apart(const TensorView& out, const char* out_name, const TensorView& other,
                   const char* other_name) {
  require(!provably_share_memory(out, other), out_name, [&] {
    return std::string("shares memory with ") + other_name +
           ": the call reads its inputs while it writes its outputs";
  });
}

void require_workspace_apart(const Workspace& workspace, std::span<const NamedView> views) {
  if (workspace.data == nullptr || workspace.bytes == 0) return;
  const auto begin = reinterpret_cast<uintptr_t>(workspace.data);
  const ByteRange block{begin, begin + workspace.bytes};
  for (const NamedView& named : views)
    require(!block.intersects(byte_range(*named.first)), "workspace", [&] {
      return std::string("overlaps ") + named.second +
             " in memory: the call may write all of its bytes";
    });
}

void require_forward_outputs_apart(const ForwardArgs& args) {
  const auto inputs = inputs_of(args.in);
  const NamedView outputs[] = {{&args.o, "o"}, {&args.lse, "lse"}};
  require_apart_from_inputs(outputs, std::span(inputs).first(kInputs), args.workspace);
}

void require_backward_outputs_apart(const BackwardArgs& args) {
  auto inputs = inputs_of(args.in);
  inputs[kInputs] = {&args.o, "o"};
  inputs[kInputs + 1] = {&args.lse, "lse"};
  inputs[kInputs + 2] = {&args.d_o, "d_o"};
  const NamedView outputs[] = {{&args.dq, "dq"},
                               {&args.dk, "dk"},
                               {&args.dv, "dv"},
                               {&args.dbias, "dbias"},
                               {&args.dsoftmax_offset, "dsoftmax_offset"}};
  require_apart_from_inputs(outputs, inputs, args.workspace);
}

}  // namespace dpa
