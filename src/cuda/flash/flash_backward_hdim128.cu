// Flash backward kernels for head dims 128 / 128 (fp16 and bf16), one pair per translation unit.
#include "cuda/flash/flash_backward_launch.cuh"

namespace dpa::cuda {

void launch_flash_backward_hdim128(const FlashBackwardParams& p, DType dtype, cudaStream_t stream) {
  launch_flash_backward_dims<128, 128>(p, dtype, stream);
}

}  // namespace dpa::cuda
