#include "cuda/memory_pool.h"

#include <cstdint>
#include <mutex>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/runtime.h"

namespace dpa::cuda {
namespace {

// A pool on `device` keeping kLibraryPoolKeptBytes, or nullptr when the device has no pools or
// the driver refuses one (the default pool then serves, as before).
cudaMemPool_t create_pool(int device) {
  int supported = 0;
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess ||
      !supported) {
    cudaGetLastError();
    return nullptr;
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  uint64_t kept = kLibraryPoolKeptBytes;
  if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &kept) != cudaSuccess) {
    cudaGetLastError();
    cudaMemPoolDestroy(pool);
    return nullptr;
  }
  return pool;  // lives as long as the process (the driver frees it at exit)
}

}  // namespace

cudaMemPool_t library_memory_pool(cudaStream_t stream) {
  static std::mutex mutex;
  static std::vector<cudaMemPool_t> pools;  // by device
  static std::vector<bool> created;
  // The stream's device; a stream capturing a graph (in the global or thread-local mode,
  // torch.cuda.graph's default is global) refuses cudaStreamGetDevice, and there the current
  // device is the stream's: the captured call launches kernels on it, which fails on a stream
  // of another device. Communicators' staging buffers, which launch none, are never captured.
  int device = 0;
  if (stream_is_capturing(stream))
    DPA_CUDA_CHECK(cudaGetDevice(&device));
  else
    DPA_CUDA_CHECK(cudaStreamGetDevice(stream, &device));
  const std::lock_guard<std::mutex> lock(mutex);
  if (size_t(device) >= pools.size()) {
    pools.resize(size_t(device) + 1, nullptr);
    created.resize(size_t(device) + 1, false);
  }
  if (!created[size_t(device)]) {
    pools[size_t(device)] = create_pool(device);
    created[size_t(device)] = true;
  }
  return pools[size_t(device)];
}

}  // namespace dpa::cuda
