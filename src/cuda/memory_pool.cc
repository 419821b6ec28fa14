#include "cuda/memory_pool.h"

#include <cstdint>
#include <mutex>
#include <vector>

#include "cuda/cuda_check.h"

namespace dpa::cuda {

cudaMemPool_t library_memory_pool() {
  static std::mutex mutex;
  static std::vector<cudaMemPool_t> pools;  // by device; nullptr: not created or unsupported
  static std::vector<bool> asked;
  int device = 0;
  DPA_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  if (size_t(device) >= pools.size()) {
    pools.resize(size_t(device) + 1, nullptr);
    asked.resize(size_t(device) + 1, false);
  }
  if (asked[size_t(device)]) return pools[size_t(device)];
  asked[size_t(device)] = true;
  int supported = 0;
  DPA_CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
  if (!supported) return nullptr;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  DPA_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  uint64_t kept = kLibraryPoolKeptBytes;
  DPA_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &kept));
  pools[size_t(device)] = pool;  // lives as long as the process (the driver frees it at exit)
  return pool;
}

}  // namespace dpa::cuda
