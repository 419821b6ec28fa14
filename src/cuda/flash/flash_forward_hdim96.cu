// Flash forward kernels for head dim 96 (fp16 and bf16): one head dim per translation unit
// keeps each nvcc invocation short and lets builds run in parallel.
#include "cuda/flash/flash_forward_launch.cuh"

namespace dpa::cuda {

void launch_flash_forward_hdim96(const FlashForwardParams& p, DType dtype, cudaStream_t stream) {
#if defined(DPA_MINIMAL_CUDA)
  (void)p, (void)dtype, (void)stream;
#else
  launch_flash_forward_dims<96, 96>(p, dtype, stream);
#endif
}

}  // namespace dpa::cuda
