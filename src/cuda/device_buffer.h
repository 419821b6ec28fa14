// Device workspace. Inside a WorkspaceScope (a call given the caller's workspace) buffers are
// carved from that block; otherwise they are stream-ordered (from the library's pool,
// cuda/memory_pool.h, and cudaFreeAsync):
// allocation and release are ordered with the kernels that use them, so no synchronisation is
// needed either way.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "core/workspace.h"
#include "cuda/cuda_check.h"
#include "cuda/host_upload.h"
#include "cuda/memory_pool.h"

namespace dpa::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, cudaStream_t stream)
      : DeviceBuffer(bytes, stream, WorkspaceArena::current()) {}
  // Memory of its own even inside a WorkspaceScope, for buffers that the caller's workspace was
  // not sized for (a communicator's staging).
  static DeviceBuffer stream_ordered(size_t bytes, cudaStream_t stream) {
    return DeviceBuffer(bytes, stream, nullptr);
  }
  ~DeviceBuffer() {
    if (data_ && owned_) cudaFreeAsync(data_, stream_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(stream_, other.stream_);
    std::swap(bytes_, other.bytes_);
    std::swap(owned_, other.owned_);
    return *this;
  }

  template <typename T = void>
  T* get() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  DeviceBuffer(size_t bytes, cudaStream_t stream, WorkspaceArena* arena)
      : stream_(stream), bytes_(bytes) {
    if (bytes == 0) return;
    if (arena != nullptr) data_ = arena->take(bytes);
    owned_ = data_ == nullptr;
    if (!owned_) return;
    if (cudaMemPool_t pool = library_memory_pool(stream))
      DPA_CUDA_CHECK(cudaMallocFromPoolAsync(&data_, bytes, pool, stream));
    else
      DPA_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream));
  }

  void* data_ = nullptr;
  cudaStream_t stream_ = nullptr;
  size_t bytes_ = 0;
  bool owned_ = false;  // stream-ordered memory of its own (else a block of the caller's workspace)
};

// Uploads a small host array (e.g. per-sequence lengths) into a fresh device buffer.
template <typename T>
DeviceBuffer upload(const std::vector<T>& values, cudaStream_t stream) {
  DeviceBuffer buffer(values.size() * sizeof(T), stream);
  upload_bytes(buffer.get(), values.data(), values.size() * sizeof(T), stream);  // `values` may die
  return buffer;
}

}  // namespace dpa::cuda
