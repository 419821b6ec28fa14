// An owning, contiguous tensor in device memory for the GPU and NCCL suites (CUDA builds only).
// Its memory is a cuda::DeviceMemory, the library's one owner of raw device allocations.
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/runtime.h"
#include "dpa/tensor.h"
#include "support/host_tensor.h"

namespace dpa::test {

// Zero-element tensors still get a (tiny) allocation so that their view is defined. `device`
// -1: the calling thread's current device.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  explicit DeviceTensor(const HostTensor& host, int device = -1);          // a copy of `host`
  DeviceTensor(DType dtype, std::vector<int64_t> shape, int device = -1);  // poisoned

  bool defined() const { return memory_.get() != nullptr; }
  const TensorView& view() const { return view_; }
  // Fills every byte with 0xFF: NaN in fp16, bf16 and fp32, so an element a backend forgets to
  // write shows up as NaN after download. Ordered on `stream` (nullptr: the legacy stream).
  void poison(void* stream = nullptr);
  // A host copy, after `stream`'s work (nullptr: the legacy stream).
  HostTensor download(void* stream = nullptr) const;

 private:
  size_t bytes_ = 0;
  std::vector<int64_t> shape_;
  cuda::DeviceMemory memory_;
  TensorView view_;
};

}  // namespace dpa::test
