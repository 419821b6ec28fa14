#include "support/device_tensor.h"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace dpa::test {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(status));
}

int resolve_device(int device) {
  if (device >= 0) return device;
  check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

}  // namespace

DeviceTensor::DeviceTensor(DType dtype, std::vector<int64_t> shape, int device)
    : shape_(std::move(shape)) {
  int64_t count = 1;
  for (int64_t extent : shape_) count *= extent;
  bytes_ = size_t(count) * dtype_size(dtype);
  device = resolve_device(device);
  // At least one allocation granule, so that a zero-element tensor has a real pointer.
  memory_ = cuda::DeviceMemory(bytes_ > 0 ? bytes_ : 16, device);
  view_ = TensorView::contiguous(memory_.get(), dtype, shape_.data(), int(shape_.size()),
                                 Device::kCUDA);
  view_.device_index = device;
  poison();
  cuda::synchronize(nullptr, device);
}

DeviceTensor::DeviceTensor(const HostTensor& host, int device)
    : DeviceTensor(host.dtype(), host.shape(), device) {
  cuda::copy_host_to_device(memory_.get(), host.view().data, bytes_, view_.device_index);
  cuda::synchronize(nullptr, view_.device_index);
}

void DeviceTensor::poison(void* stream) {
  if (bytes_ == 0) return;
  cuda::DeviceGuard current(view_.device_index);
  check(cudaMemsetAsync(memory_.get(), 0xFF, bytes_, static_cast<cudaStream_t>(stream)),
        "cudaMemsetAsync");
}

HostTensor DeviceTensor::download(void* stream) const {
  HostTensor host(view_.dtype, shape_);
  cuda::DeviceGuard current(view_.device_index);
  if (bytes_ > 0)
    cuda::copy_to_host(host.view().data, memory_.get(), bytes_, stream);
  else
    cuda::synchronize(stream, view_.device_index);
  return host;
}

}  // namespace dpa::test
