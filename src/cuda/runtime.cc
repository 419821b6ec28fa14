#include "cuda/runtime.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <utility>

#include "cuda/cuda_check.h"
#include "dpa/error.h"

namespace dpa::cuda {

const DeviceInfo& device_info(int device_index) {
  static std::mutex mutex;
  static std::map<int, DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = cache.find(device_index);
  if (found != cache.end()) return found->second;
  DeviceInfo info;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error for later calls
    count = 0;
  }
  if (device_index >= 0 && device_index < count) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device_index) == cudaSuccess) {
      info.present = true;
      info.arch = prop.major * 10 + prop.minor;
      info.sm_count = prop.multiProcessorCount;
      info.shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
      info.l2_bytes = size_t(prop.l2CacheSize);
      info.name = prop.name;
    }
  }
  return cache.emplace(device_index, info).first->second;
}

size_t free_device_memory(int device_index) {
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) return 0;
  if (current != device_index && cudaSetDevice(device_index) != cudaSuccess) return 0;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) free_bytes = 0;
  if (current != device_index) cudaSetDevice(current);
  return free_bytes;
}

bool is_device_memory_of(const void* pointer, int device_index) {
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, pointer);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear a sticky "invalid value"
    return false;
  }
  return attributes.type == cudaMemoryTypeManaged ||
         (attributes.type == cudaMemoryTypeDevice && attributes.device == device_index);
}

bool stream_is_capturing(void* stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  DPA_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture));
  return capture != cudaStreamCaptureStatusNone;
}

void copy_to_host(void* host_destination, const void* device_source, size_t bytes, void* stream) {
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  // A graph replays its kernels without the host: a table read here would be this call's
  // forever, and the synchronisation below would end the capture with an opaque error.
  if (stream_is_capturing(stream))
    throw Error(ErrorCode::kNotSupported, "stream",
                "is capturing a CUDA graph, and this call reads a device table on the host "
                "before it runs (sequence boundaries of a packed layout, or a KV cache's "
                "tables in check_tables mode); pass that table in host memory to capture it");
  DPA_CUDA_CHECK(
      cudaMemcpyAsync(host_destination, device_source, bytes, cudaMemcpyDeviceToHost, cuda_stream));
  DPA_CUDA_CHECK(cudaStreamSynchronize(cuda_stream));
}

DeviceGuard::DeviceGuard(int device_index) : current_(device_index) {
  DPA_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != current_) DPA_CUDA_CHECK(cudaSetDevice(current_));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != current_) cudaSetDevice(previous_);
}

DeviceMemory::DeviceMemory(size_t bytes, int device_index) : device_(device_index) {
  if (bytes == 0) return;
  DeviceGuard current(device_index);
  DPA_CUDA_CHECK(cudaMalloc(&data_, bytes));
}

DeviceMemory::~DeviceMemory() {
  if (data_ == nullptr) return;
  int previous = -1;
  if (cudaGetDevice(&previous) == cudaSuccess && previous != device_) cudaSetDevice(device_);
  cudaFree(data_);  // a destructor cannot report; cudaFree fails only on a broken context
  if (previous >= 0 && previous != device_) cudaSetDevice(previous);
}

DeviceMemory::DeviceMemory(DeviceMemory&& other) noexcept
    : data_(other.data_), device_(other.device_) {
  other.data_ = nullptr;
}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    DeviceMemory old(std::move(*this));
    data_ = other.data_;
    device_ = other.device_;
    other.data_ = nullptr;
  }
  return *this;
}

void copy_host_to_device(void* device_destination, const void* host_source, size_t bytes,
                         int device_index) {
  if (bytes == 0) return;
  DeviceGuard current(device_index);
  DPA_CUDA_CHECK(cudaMemcpy(device_destination, host_source, bytes, cudaMemcpyHostToDevice));
}

void copy_device_to_host(void* host_destination, const void* device_source, size_t bytes,
                         int device_index) {
  if (bytes == 0) return;
  DeviceGuard current(device_index);
  DPA_CUDA_CHECK(cudaMemcpy(host_destination, device_source, bytes, cudaMemcpyDeviceToHost));
}

void fill_device_bytes(void* device_destination, int value, size_t bytes, int device_index) {
  if (bytes == 0) return;
  DeviceGuard current(device_index);
  DPA_CUDA_CHECK(cudaMemset(device_destination, value, bytes));
}

void synchronize(void* stream, int device_index) {
  DeviceGuard current(device_index);
  DPA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

StreamPoint::StreamPoint(void* stream, int device_index) : device_(device_index) {
  DeviceGuard current(device_index);
  cudaEvent_t event = nullptr;
  DPA_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(event, static_cast<cudaStream_t>(stream));
  if (recorded != cudaSuccess) cudaEventDestroy(event);
  DPA_CUDA_CHECK(recorded);
  event_ = event;
}

StreamPoint::~StreamPoint() {
  int previous = -1;
  if (cudaGetDevice(&previous) == cudaSuccess && previous != device_) cudaSetDevice(device_);
  cudaEventDestroy(static_cast<cudaEvent_t>(event_));  // released once it completes
  if (previous >= 0 && previous != device_) cudaSetDevice(previous);
}

bool StreamPoint::reached() const {
  DeviceGuard current(device_);
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (status == cudaErrorNotReady) return false;
  DPA_CUDA_CHECK(status);
  return true;
}

void StreamPoint::wait() const {
  DeviceGuard current(device_);
  DPA_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
}

void StreamPoint::order(void* stream) const {
  DeviceGuard current(device_);
  DPA_CUDA_CHECK(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event_), 0));
}

}  // namespace dpa::cuda
