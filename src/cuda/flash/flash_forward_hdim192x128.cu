// Flash forward kernels for the MLA pair dqk 192 / dv 128 (fp16 and bf16).
#include "cuda/flash/flash_forward_launch.cuh"

namespace dpa::cuda {

void launch_flash_forward_hdim192x128(const FlashForwardParams& p, DType dtype,
                                      cudaStream_t stream) {
#if defined(DPA_MINIMAL_CUDA)
  (void)p, (void)dtype, (void)stream;
#else
  launch_flash_forward_dims<192, 128>(p, dtype, stream);
#endif
}

}  // namespace dpa::cuda
