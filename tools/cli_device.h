// Where `dpa run` keeps its tensors: host memory, or CUDA device memory when the library was
// built with CUDA and a device is present. Only the demo needs device memory; `dpa attention`
// and `dpa explain` work on host data and shapes.
#pragma once

#include <string>

#include "dpa/tensor.h"
#include "npy.h"
#if defined(DPA_WITH_CUDA)
#include "cuda/runtime.h"
#endif

namespace dpa::cli {

// The number of CUDA devices usable by this build (0 without CUDA support or without a device);
// `why` receives a short explanation when it is 0.
int cuda_device_count(std::string* why);

// Waits for queued device work (for timing). A no-op on the host.
void synchronize(Device device);

// An array living on `device`: a copy of a host array, or zero-filled storage.
class DeviceArray {
 public:
  DeviceArray(const npy::Array& host, Device device);
  DeviceArray(DType dtype, std::vector<int64_t> shape, Device device);

  TensorView view() const;
  npy::Array to_host() const;

 private:
  npy::Array host_;  // the storage itself on the host; shape and dtype only on a device
  Device device_;
#if defined(DPA_WITH_CUDA)
  cuda::DeviceMemory device_data_;  // empty for zero bytes
#endif
};

}  // namespace dpa::cli
