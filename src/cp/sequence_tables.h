// Host copies of a CP call's sequence tables (cu_seqlens*): the algorithms read them on the
// host to lay out the chunks, while every other tensor stays where the caller put it.
#pragma once

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "dpa/arguments.h"
#include "dpa/error.h"

#if defined(DPA_WITH_CUDA)
#include "cuda/runtime.h"
#endif

namespace dpa::cp {

class SequenceTables {
 public:
  // Waits for the caller's stream first: its kernels may still be writing the tables.
  SequenceTables(const TensorView& q, void* stream) : device_index_(q.device_index) {
#if defined(DPA_WITH_CUDA)
    cuda::synchronize(stream, device_index_);
#else
    (void)stream;
#endif
  }

  // Points every device table of `in` at a host copy (a host table stays as it is). The copies
  // live as long as this object.
  void to_host(AttentionInputs& in) {
    for (auto [t, name] : {std::pair{&in.cu_seqlens_q, "cu_seqlens_q"},
                           {&in.cu_seqlens_kv, "cu_seqlens_kv"},
                           {&in.cu_seqlens_q_padded, "cu_seqlens_q_padded"},
                           {&in.cu_seqlens_kv_padded, "cu_seqlens_kv_padded"}})
      *t = copy(*t, name);
  }

 private:
  TensorView copy(const TensorView& t, const char* name) {
    if (!t.defined() || t.device == Device::kCPU) return t;
    require(t.device_index == device_index_, name, "must be on q's device");
    require(t.is_contiguous(), name, "must be contiguous");
    const size_t bytes = size_t(t.numel()) * dtype_size(t.dtype);
    buffers_.emplace_back(bytes);
    TensorView host = t;
    host.data = buffers_.back().data();
    host.device = Device::kCPU;
    host.device_index = 0;
#if defined(DPA_WITH_CUDA)
    cuda::copy_device_to_host(host.data, t.data, bytes, device_index_);
#else
    throw Error(ErrorCode::kNotSupported, name, "CUDA tensors need a build with CUDA");
#endif
    return host;
  }

  int device_index_;
  std::deque<std::vector<unsigned char>> buffers_;  // stable addresses
};

}  // namespace dpa::cp
