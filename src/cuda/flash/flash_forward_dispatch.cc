#include "cuda/flash/flash_forward_launch.h"
#include "cuda/flash/flash_tiles.h"
#include "dpa/error.h"

namespace dpa::cuda {

void launch_flash_forward(const FlashForwardParams& p, DType dtype, int head_dim_qk, int head_dim_v,
                          cudaStream_t stream) {
  if (!flash_forward_has_head_dims(head_dim_qk, head_dim_v))
    throw Error(ErrorCode::kInternal, "",
                "flash forward selected for head dims without kernels (the selector must "
                "reject these)");
  if (head_dim_qk == 192 && head_dim_v == 128)
    return launch_flash_forward_hdim192x128(p, dtype, stream);
  switch (head_dim_qk) {
    case 64:
      return launch_flash_forward_hdim64(p, dtype, stream);
    case 96:
      return launch_flash_forward_hdim96(p, dtype, stream);
    case 128:
      return launch_flash_forward_hdim128(p, dtype, stream);
    case 192:
      return launch_flash_forward_hdim192(p, dtype, stream);
    case 256:
      return launch_flash_forward_hdim256(p, dtype, stream);
    default:
      break;
  }
  throw Error(ErrorCode::kInternal, "", "unreachable head dim dispatch");
}

}  // namespace dpa::cuda
