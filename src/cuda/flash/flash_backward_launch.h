// Host entry to the flash backward kernels: dispatch on dtype and head dims.
#pragma once

#include <cuda_runtime_api.h>

#include "core/problem.h"
#include "cuda/flash/flash_backward_params.h"
#include "cuda/flash/flash_head_dims.h"
#include "dpa/types.h"

namespace dpa::cuda {

// The whole backward of a validated problem: workspace, rows outside every sequence, the
// prepare, dq and dk/dv kernels and the sink gradient's reduction.
void run_flash_backward(const AttentionProblem& problem, cudaStream_t stream);
// Every buffer run_flash_backward allocates (the caller's workspace, core/workspace.h).
size_t flash_backward_workspace_bytes(const AttentionProblem& problem);

// Runs the kernels of a head-dim pair (an internal error for a pair without kernels: the
// selector refuses those).
void launch_flash_backward(const FlashBackwardParams& p, DType dtype, int head_dim_qk,
                           int head_dim_v, cudaStream_t stream);
// The kernels of one head-dim pair (flash_backward_launch.cuh), instantiated for each pair of
// DPA_FLASH_HEAD_DIM_PAIRS in its generated translation unit (flash_pass_pair.cu.in).
template <int kHeadDimQK, int kHeadDimV>
void launch_flash_backward_dims(const FlashBackwardParams& p, DType dtype, cudaStream_t stream);
#define DPA_FLASH_BACKWARD_EXTERN(QK, V)                                                    \
  extern template void launch_flash_backward_dims<QK, V>(const FlashBackwardParams&, DType, \
                                                         cudaStream_t);
DPA_FLASH_HEAD_DIM_PAIRS(DPA_FLASH_BACKWARD_EXTERN)
#undef DPA_FLASH_BACKWARD_EXTERN

}  // namespace dpa::cuda
