// CUDA tensors on the CP algorithms that move host buffers (virtual ranks on one GPU): a
// host copy of each input and output, the outputs copied back at the end.
#pragma once

#include <deque>
#include <utility>
#include <vector>

#include "core/problem_builder.h"
#include "dpa/arguments.h"

#if defined(DPA_WITH_CUDA)
#include "cuda/runtime.h"
#endif

namespace dpa::cp {

// ---- CUDA tensors: virtual ranks on one GPU ----
// The CP algorithm moves host buffers between ranks (in-process ranks are threads), so a call
// with CUDA tensors copies its inputs to the host, runs every tile on the device
// (tile.cc, device_stage.h) and copies its outputs back; it returns with the outputs in place
// (synchronous with respect to the caller's stream). Correct and simple, not fast: it is the
// single-GPU check of the GPU tiles, not the NCCL path.
class HostStaging {
 public:
  // Waits for the caller's stream first: its kernels may still be writing the inputs.
  HostStaging(const TensorView& q, void* stream) : device_index_(q.device_index) {
#if defined(DPA_WITH_CUDA)
    cuda::synchronize(stream, device_index_);
#else
    (void)stream;
#endif
  }

  // A host copy of an input on q's device (a host tensor passes through unchanged).
  TensorView in(const TensorView& t, const char* name) { return stage(t, name, true); }
  // A host copy of an output on q's device, copied back by copy_outputs_back(); copied in
  // first so that elements the call does not write keep their contents, as on the host.
  TensorView out(const TensorView& t, const char* name) {
    TensorView host = stage(t, name, true);
    if (t.defined() && t.device == Device::kCUDA) outputs_.push_back({t, host});
    return host;
  }
  // Returns once the outputs are in place, for any stream of the caller's.
  void copy_outputs_back() {
#if defined(DPA_WITH_CUDA)
    for (const auto& [device, host] : outputs_)
      cuda::copy_host_to_device(device.data, host.data, bytes(device), device_index_);
    cuda::synchronize(nullptr, device_index_);
#endif
  }

 private:
  static size_t bytes(const TensorView& t) { return size_t(t.numel()) * dtype_size(t.dtype); }

  TensorView stage(const TensorView& t, const char* name, bool copy_in) {
    if (!t.defined() || t.device == Device::kCPU) return t;
    require(t.device_index == device_index_, name, "must be on q's device");
    require(t.is_contiguous(), name,
            "must be contiguous under context parallelism with CUDA tensors (it is staged "
            "through the host)");
    buffers_.emplace_back(bytes(t));
    TensorView host = t;
    host.data = buffers_.back().data();
    host.device = Device::kCPU;
    host.device_index = 0;
#if defined(DPA_WITH_CUDA)
    if (copy_in) cuda::copy_device_to_host(host.data, t.data, bytes(t), device_index_);
#else
    (void)copy_in;
    throw Error(ErrorCode::kNotSupported, name, "CUDA tensors need a build with CUDA");
#endif
    return host;
  }

  int device_index_;
  std::deque<std::vector<unsigned char>> buffers_;  // stable addresses
  std::vector<std::pair<TensorView, TensorView>> outputs_;
};

// Host copies of the sequence tables alone (the device-resident algorithms read them on the
// host to lay out the chunks; every other tensor stays on the device).
inline void stage_sequence_tables(HostStaging& staging, AttentionInputs& in) {
  for (auto [t, name] : {std::pair{&in.cu_seqlens_q, "cu_seqlens_q"},
                         {&in.cu_seqlens_kv, "cu_seqlens_kv"},
                         {&in.cu_seqlens_q_padded, "cu_seqlens_q_padded"},
                         {&in.cu_seqlens_kv_padded, "cu_seqlens_kv_padded"}})
    *t = staging.in(*t, name);
}

inline void stage_inputs(HostStaging& staging, AttentionInputs& in) {
  for (auto [t, name] : {std::pair{&in.q, "q"},
                         {&in.k, "k"},
                         {&in.v, "v"},
                         {&in.softmax_offset, "softmax_offset"},
                         {&in.alibi_slopes, "alibi_slopes"},
                         {&in.bias, "bias"},
                         {&in.attn_mask, "attn_mask"}})
    *t = staging.in(*t, name);
  stage_sequence_tables(staging, in);
}

}  // namespace dpa::cp
