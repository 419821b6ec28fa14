#include "cuda/flash/flash_forward_launch.h"
#include "dpa/error.h"

namespace dpa::cuda {

void launch_flash_forward(const FlashForwardParams& p, DType dtype, int head_dim_qk, int head_dim_v,
                          cudaStream_t stream) {
#define DPA_FLASH_FORWARD_PAIR(QK, V)       \
  if (head_dim_qk == QK && head_dim_v == V) \
    return launch_flash_forward_dims<QK, V>(p, dtype, stream);
  DPA_FLASH_HEAD_DIM_PAIRS(DPA_FLASH_FORWARD_PAIR)
#undef DPA_FLASH_FORWARD_PAIR
  throw Error(ErrorCode::kInternal, "",
              "flash forward selected for head dims without kernels (the selector must reject "
              "these)");
}

}  // namespace dpa::cuda
