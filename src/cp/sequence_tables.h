// Host copies of a CP call's sequence tables (cu_seqlens*): the algorithms read them on the
// host to lay out the chunks, while every other tensor stays where the caller put it. Tables
// passed in host memory cost no host wait.
#pragma once

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "cp/calls_in_flight.h"
#include "dpa/arguments.h"
#include "dpa/error.h"

#if defined(DPA_WITH_CUDA)
#include "cuda/runtime.h"
#endif

namespace dpa::cp {

class SequenceTables {
 public:
  // Points every device table of `in` at a host copy (a host table stays as it is). The copies
  // live as long as this object. Only a device table makes the host wait: each is copied after
  // the caller's `stream` (its kernels may still be writing the table), and the host waits for
  // the copy. That stream may be ordered after earlier calls of the same object, so their
  // transfers are waited for first (`in_flight`, may be null), where a failed peer throws at its
  // deadline instead of the copy waiting for ever.
  void to_host(AttentionInputs& in, void* stream, CallsInFlight* in_flight) {
    bool waited = false;
    for (auto [t, name] : {std::pair{&in.cu_seqlens_q, "cu_seqlens_q"},
                           {&in.cu_seqlens_kv, "cu_seqlens_kv"},
                           {&in.cu_seqlens_q_padded, "cu_seqlens_q_padded"},
                           {&in.cu_seqlens_kv_padded, "cu_seqlens_kv_padded"}}) {
      if (!t->defined() || t->device == Device::kCPU) continue;
      require(t->device_index == in.q.device_index, name, "must be on q's device");
      require(t->is_contiguous(), name, "must be contiguous");
      if (in_flight != nullptr && !waited) in_flight->wait();
      waited = true;
      *t = copy(*t, name, stream);
    }
  }

 private:
  TensorView copy(const TensorView& t, const char* name, void* stream) {
    const size_t bytes = size_t(t.numel()) * dtype_size(t.dtype);
    buffers_.emplace_back(bytes);
    TensorView host = t;
    host.data = buffers_.back().data();
    host.device = Device::kCPU;
    host.device_index = 0;
#if defined(DPA_WITH_CUDA)
    (void)name;
    const cuda::DeviceGuard guard(t.device_index);
    cuda::copy_to_host(host.data, t.data, bytes, stream);
#else
    (void)stream;
    throw Error(ErrorCode::kNotSupported, name, "CUDA tensors need a build with CUDA");
#endif
    return host;
  }

  std::deque<std::vector<unsigned char>> buffers_;  // stable addresses
};

}  // namespace dpa::cp
