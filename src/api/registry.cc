// The composition root (DESIGN.md §1): which backends this build has, in the selector's
// preference order. Core declares registered_backends(); only this file knows the backends.
#include "core/backend.h"
#include "cpu/cpu_backends.h"

#if defined(DPA_WITH_CUDA)
#include "cuda/cuda_backends.h"
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

}  // namespace dpa
