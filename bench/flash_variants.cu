// Tile-shape variants of the flash forward kernel for the dev bench: same kernel body, other
// (warps, block_n) choices, so a single device call can compare them.
#include "bench/flash_variants.h"
#include "cuda/flash/flash_forward_launch.cuh"
#include "cuda/flash/flash_forward_plan.h"

namespace dpa::cuda {
namespace {

template <int kWarps, int kBlockN, int kSlabs>
void run_shape(const AttentionProblem& p, cudaStream_t stream) {
  using Traits = FlashForwardTraits<__nv_bfloat16, 128, 128, kWarps, kBlockN, kSlabs>;
  FlashTileShape shape{Traits::kBlockM, Traits::kBlockN,      Traits::kWarps,
                       Traits::kSlabs,  Traits::kSharedBytes, 2};
  FlashForwardPlan plan = plan_flash_forward(p, shape, stream);
  plan.params.decode = false;
  launch_flash_forward_traits<Traits>(plan.params, stream);
  if (plan.params.num_splits > 1) launch_merge_partials(plan.params, p.dtype, 128, stream);
}

}  // namespace

const char* flash_variant_name(int variant) {
  switch (variant) {
    case 0:
      return "4 warps x 32 rows, block_n 64";
    case 1:
      return "8 warps x 16 rows, block_n 64";
    case 2:
      return "4 warps x 32 rows, block_n 32";
    case 3:
      return "8 warps x 16 rows, block_n 128";
    default:
      return nullptr;
  }
}

void run_flash_variant(int variant, const AttentionProblem& p) {
  auto stream = static_cast<cudaStream_t>(p.stream);
  switch (variant) {
    case 0:
      return run_shape<4, 64, 2>(p, stream);
    case 1:
      return run_shape<8, 64, 1>(p, stream);
    case 2:
      return run_shape<4, 32, 2>(p, stream);
    case 3:
      return run_shape<8, 128, 1>(p, stream);
    default:
      return;
  }
}

}  // namespace dpa::cuda
