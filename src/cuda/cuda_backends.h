// The CUDA backends (DESIGN.md §1): both declare capabilities the selector reads.
#pragma once

#include "core/backend.h"

namespace dpa {

// Our fused flash kernels (mma.sync, ldmatrix, cp.async): forward, split-KV decode.
const Backend& cuda_flash_backend();

// cuBLAS batched GEMMs plus fused elementwise kernels; O(s^2) memory; every feature. The GPU
// reference and the fallback for arbitrary masks and bias gradients.
const Backend& cuda_unfused_backend();

}  // namespace dpa
