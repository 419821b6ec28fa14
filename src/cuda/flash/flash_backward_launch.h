// Host entry to the flash backward kernels: dispatch on dtype and head dims.
#pragma once

#include <cuda_runtime_api.h>

#include "core/problem.h"
#include "cuda/flash/flash_backward_params.h"
#include "dpa/types.h"

namespace dpa::cuda {

// The whole backward of a validated problem: workspace, rows outside every sequence, the
// prepare, dq and dk/dv kernels and the sink gradient's reduction.
void run_flash_backward(const AttentionProblem& problem, cudaStream_t stream);
// Every buffer run_flash_backward allocates (the caller's workspace, core/workspace.h).
size_t flash_backward_workspace_bytes(const AttentionProblem& problem);

// The kernels for one head-dim pair (flash_backward_hdim*.cu).
void launch_flash_backward(const FlashBackwardParams& p, DType dtype, int head_dim_qk,
                           int head_dim_v, cudaStream_t stream);
void launch_flash_backward_hdim64(const FlashBackwardParams& p, DType dtype, cudaStream_t stream);
void launch_flash_backward_hdim96(const FlashBackwardParams& p, DType dtype, cudaStream_t stream);
void launch_flash_backward_hdim128(const FlashBackwardParams& p, DType dtype, cudaStream_t stream);
void launch_flash_backward_hdim192(const FlashBackwardParams& p, DType dtype, cudaStream_t stream);
void launch_flash_backward_hdim256(const FlashBackwardParams& p, DType dtype, cudaStream_t stream);
void launch_flash_backward_hdim192x128(const FlashBackwardParams& p, DType dtype,
                                       cudaStream_t stream);

}  // namespace dpa::cuda
