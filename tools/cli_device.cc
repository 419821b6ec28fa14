#include "cli_device.h"

#include "dpa/error.h"

#if defined(DPA_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace dpa::cli {

namespace {

#if defined(DPA_WITH_CUDA)
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(ErrorCode::kBackendFailure, "",
                std::string(what) + " failed: " + cudaGetErrorString(status));
  }
}
#else
[[noreturn]] void no_cuda() {
  throw Error(ErrorCode::kNotSupported, "", "this build of dpa has no CUDA support");
}
#endif

}  // namespace

int cuda_device_count(std::string* why) {
#if defined(DPA_WITH_CUDA)
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" status
    if (why) *why = std::string("no usable CUDA device (") + cudaGetErrorString(status) + ")";
    return 0;
  }
  if (count == 0 && why) *why = "no CUDA device";
  return count;
#else
  if (why) *why = "built without CUDA";
  return 0;
#endif
}

void synchronize(Device device) {
  if (device == Device::kCPU) return;
#if defined(DPA_WITH_CUDA)
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#else
  no_cuda();
#endif
}

DeviceArray::DeviceArray(const npy::Array& host, Device device) : host_(host), device_(device) {
  if (device_ == Device::kCPU) return;
#if defined(DPA_WITH_CUDA)
  if (!host_.bytes.empty()) {
    device_data_ = cuda::DeviceMemory(host_.bytes.size(), 0);
    check(cudaMemcpy(device_data_.get(), host_.bytes.data(), host_.bytes.size(),
                     cudaMemcpyHostToDevice),
          "cudaMemcpy");
  }
  // Keep shape and dtype; the device holds the data.
  host_.bytes.clear();
  host_.bytes.shrink_to_fit();
#else
  no_cuda();
#endif
}

DeviceArray::DeviceArray(DType dtype, std::vector<int64_t> shape, Device device)
    : DeviceArray(npy::Array(dtype, std::move(shape)), device) {}

TensorView DeviceArray::view() const {
  if (device_ == Device::kCPU) return host_.view();
  static unsigned char empty_storage[8];  // a defined view of zero elements
  void* data = static_cast<void*>(empty_storage);
#if defined(DPA_WITH_CUDA)
  if (device_data_.get() != nullptr) data = device_data_.get();
#endif
  return TensorView::contiguous(data, host_.dtype, host_.shape.data(), host_.ndim(), device_);
}

npy::Array DeviceArray::to_host() const {
  if (device_ == Device::kCPU) return host_;
  npy::Array out(host_.dtype, host_.shape);
#if defined(DPA_WITH_CUDA)
  if (!out.bytes.empty()) {
    check(
        cudaMemcpy(out.bytes.data(), device_data_.get(), out.bytes.size(), cudaMemcpyDeviceToHost),
        "cudaMemcpy");
  }
#endif
  return out;
}

}  // namespace dpa::cli
