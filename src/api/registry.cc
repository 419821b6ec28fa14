// The composition root (DESIGN.md §1): which backends this build has, in the selector's
// preference order, and its device access. Core declares registered_backends() and
// device_access(); only this file knows the backends and the CUDA layer.
#include "core/backend.h"
#include "core/device_access.h"
#include "cpu/cpu_backends.h"

#if defined(DPA_WITH_CUDA)
#include "cuda/cuda_backends.h"
#include "cuda/runtime.h"
#endif

namespace dpa {

const std::vector<const Backend*>& registered_backends() {
  // Fastest first: the selector takes the first eligible one (DESIGN.md §6).
  static const std::vector<const Backend*> backends = {
#if defined(DPA_WITH_CUDA)
    &cuda_flash_backend(),
    &cuda_unfused_backend(),
#endif
    &cpu_tiled_backend(),
    &cpu_exact_backend(),
  };
  return backends;
}

#if defined(DPA_WITH_CUDA)
namespace {

class CudaDeviceAccess final : public DeviceAccess {
 public:
  int arch(int device_index) const override { return cuda::device_info(device_index).arch; }
  void copy_to_host(void* host_destination, const void* device_source, size_t bytes,
                    void* stream) const override {
    cuda::copy_to_host(host_destination, device_source, bytes, stream);
  }
};

}  // namespace
#endif

const DeviceAccess* device_access() {
#if defined(DPA_WITH_CUDA)
  static const CudaDeviceAccess access;
  return &access;
#else
  return nullptr;
#endif
}

}  // namespace dpa
