// Host entry to the flash forward kernels: dispatch on dtype and head dims.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/flash/flash_head_dims.h"
#include "cuda/flash/flash_params.h"
#include "dpa/types.h"

namespace dpa::cuda {

// Runs the kernel (and, with p.num_splits > 1, the merge of its partials).
void launch_flash_forward(const FlashForwardParams& p, DType dtype, int head_dim_qk, int head_dim_v,
                          cudaStream_t stream);

// The kernels of one head-dim pair (flash_forward_launch.cuh), instantiated for each pair of
// DPA_FLASH_HEAD_DIM_PAIRS in its generated translation unit (flash_pass_pair.cu.in).
template <int kHeadDimQK, int kHeadDimV>
void launch_flash_forward_dims(const FlashForwardParams& p, DType dtype, cudaStream_t stream);
#define DPA_FLASH_FORWARD_EXTERN(QK, V)                                                   \
  extern template void launch_flash_forward_dims<QK, V>(const FlashForwardParams&, DType, \
                                                        cudaStream_t);
DPA_FLASH_HEAD_DIM_PAIRS(DPA_FLASH_FORWARD_EXTERN)
#undef DPA_FLASH_FORWARD_EXTERN

}  // namespace dpa::cuda
