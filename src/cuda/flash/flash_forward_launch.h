// Host entry to the flash forward kernels: dispatch on dtype and head dims.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/flash/flash_params.h"
#include "dpa/types.h"

namespace dpa::cuda {

// Runs the kernel (and, with p.num_splits > 1, the merge of its partials).
void launch_flash_forward(const FlashForwardParams& p, DType dtype, int head_dim_qk, int head_dim_v,
                          cudaStream_t stream);

// One declaration per compiled head-dim pair (flash_forward_hdim*.cu).
void launch_flash_forward_hdim64(const FlashForwardParams& p, DType dtype, cudaStream_t stream);
void launch_flash_forward_hdim96(const FlashForwardParams& p, DType dtype, cudaStream_t stream);
void launch_flash_forward_hdim128(const FlashForwardParams& p, DType dtype, cudaStream_t stream);
void launch_flash_forward_hdim192(const FlashForwardParams& p, DType dtype, cudaStream_t stream);
void launch_flash_forward_hdim256(const FlashForwardParams& p, DType dtype, cudaStream_t stream);
void launch_flash_forward_hdim192x128(const FlashForwardParams& p, DType dtype,
                                      cudaStream_t stream);

}  // namespace dpa::cuda
