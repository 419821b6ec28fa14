// The CUDA backends (DESIGN.md §1): both declare capabilities the selector reads.
#pragma once

#include "core/backend.h"

namespace dpa {

// Our flash kernels (docs/cuda_flash.md): the forward (mma.sync on sm_80; wgmma with TMA or
// cp.async producers on sm_90; split-KV decode) and the backward (the atomic-free pairs, the
// single-kernel family on sm_90), O(s) memory.
const Backend& cuda_flash_backend();

// cuBLAS batched GEMMs plus fused elementwise kernels; O(s^2) memory; every feature. The GPU
// reference and the fallback for arbitrary masks and bias gradients.
const Backend& cuda_unfused_backend();

}  // namespace dpa
