// Flash backward kernels for head dims 96 / 96 (fp16 and bf16), one pair per translation unit.
#include "cuda/flash/flash_backward_launch.cuh"

namespace dpa::cuda {

void launch_flash_backward_hdim96(const FlashBackwardParams& p, DType dtype, cudaStream_t stream) {
#if defined(DPA_MINIMAL_CUDA)
  (void)p, (void)dtype, (void)stream;
#else
  launch_flash_backward_dims<96, 96>(p, dtype, stream);
#endif
}

}  // namespace dpa::cuda
