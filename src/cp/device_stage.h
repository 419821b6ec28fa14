// Device copies of host tensors for context parallelism with virtual ranks on one GPU: the CP
// algorithms move host buffers between ranks (threads), and each tile runs on the device
// (DESIGN.md §8, docs/context_parallel.md "CP on one GPU").
#pragma once

#include <vector>

#include "dpa/tensor.h"

#if defined(DPA_WITH_CUDA)
#include "cuda/runtime.h"
#endif

namespace dpa::cp {

// Every copy lives as long as the stage. Throws ErrorCode::kNotSupported in a build without
// CUDA.
class DeviceStage {
 public:
  explicit DeviceStage(int device_index);
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;

  // A contiguous device copy of a contiguous host tensor; an undefined view stays undefined.
  TensorView upload(const TensorView& host);
  // Contiguous device memory shaped like `host`, every byte 0xFF (NaN in fp16, bf16 and fp32):
  // an element a backend forgets to write shows up instead of passing as stale memory.
  TensorView allocate_like(const TensorView& host);
  // Copies a device view made by this stage into the contiguous host view of its shape.
  void download(const TensorView& device, const TensorView& host) const;

 private:
  TensorView allocate(const TensorView& host);  // contents undefined

  [[maybe_unused]] int device_index_;  // read only by the CUDA build
#if defined(DPA_WITH_CUDA)
  std::vector<cuda::DeviceMemory> memory_;
#endif
};

}  // namespace dpa::cp
