// Flash forward kernels for head dim 128 (fp16 and bf16): one head dim per translation unit
// keeps each nvcc invocation short and lets builds run in parallel.
#include "cuda/flash/flash_forward_launch.cuh"

namespace dpa::cuda {

void launch_flash_forward_hdim128(const FlashForwardParams& p, DType dtype, cudaStream_t stream) {
  launch_flash_forward_dims<128, 128>(p, dtype, stream);
}

}  // namespace dpa::cuda
