// Kernel variants of the flash forward for the dev bench (bf16, head dim 128; then 64 and 256),
// so a single device call can compare them: the warp-specialised kernel's tile shapes, stages,
// producers and persistent grid, and the mma.sync family.
#include "bench/flash_variants.h"
#include "cuda/flash/flash_forward_launch.cuh"
#include "cuda/flash/flash_forward_plan.h"

namespace dpa::cuda {
namespace {

template <typename Traits>
FlashTileShape shape_of(bool wgmma) {
  return FlashTileShape{
      Traits::kBlockM, Traits::kBlockN, Traits::kThreads / 32, 1, Traits::kSharedBytes, 1, wgmma};
}

template <typename Traits>
void run_wgmma_ws(const AttentionProblem& p, cudaStream_t stream, bool tma = true,
                  bool persistent = true) {
  FlashTileShape shape = shape_of<Traits>(true);
  shape.warp_specialized = true;
  FlashForwardPlan plan = plan_flash_forward(p, shape, stream);
  plan.params.tma = plan.params.tma && tma;
  if (!persistent) plan.params.persistent_blocks = 0;
  // The dynamic scheduler needs both (launch_flash_forward_ws_kernel refuses it otherwise).
  if (!plan.params.tma || plan.params.persistent_blocks == 0) {
    if (plan.params.tile_counter) plan.params.persistent_blocks = 0;
    plan.params.tile_counter = nullptr;
  }
  // The instantiation the library would pick (the plain-logits one for plain d64 problems).
  launch_flash_forward_ws<Traits>(plan.params, stream);
  if (plan.params.num_splits > 1)
    launch_merge_partials(plan.params, p.dtype, Traits::kHeadDimV, stream);
}

template <int kWarps, int kBlockN, int kSlabs>
void run_mma_sync(const AttentionProblem& p, cudaStream_t stream) {
  using Traits = FlashForwardTraits<__nv_bfloat16, 128, 128, kWarps, kBlockN, kSlabs>;
  FlashTileShape shape{Traits::kBlockM, Traits::kBlockN,      Traits::kWarps,
                       Traits::kSlabs,  Traits::kSharedBytes, 2};
  FlashForwardPlan plan = plan_flash_forward(p, shape, stream);
  plan.params.decode = false;
  launch_flash_forward_traits<Traits>(plan.params, stream);
  if (plan.params.num_splits > 1) launch_merge_partials(plan.params, p.dtype, 128, stream);
}

}  // namespace

// Variant 0 is what the library runs on sm_90 (flash_forward_shape_for; TMA copies where the
// problem allows them); the others are measured against it. Experiments that lost (a 96-key
// tile, the scale and cap folded into exp2, tanh.approx, exp2 on the FMA pipes, the plain
// two-warpgroup wgmma form without a producer, removed in session 32) were dropped from the
// library kernels; their numbers are in docs/perf.md.
const char* flash_variant_name(int variant) {
  switch (variant) {
    case 0:
      return "wgmma warp-specialised ping-pong, block_n 128, 3 stages (library on sm_90)";
    case 1:
      return "mma.sync 4 warps x 32 rows, block_n 64";
    case 2:
      return "wgmma warp-specialised ping-pong, block_n 128, 2 stages";
    case 3:
      return "wgmma warp-specialised ping-pong, block_n 64, 3 stages";
    case 4:
      return "wgmma warp-specialised ping-pong, block_n 128, 3 stages, cp.async producer";
    case 5:
      return "wgmma warp-specialised ping-pong, block_n 128, 3 stages, one block per work block";
    case 6:
      return "d64 wgmma warp-specialised ping-pong (library on sm_90)";
    case 7:
      return "d64 wgmma warp-specialised ping-pong, one block per work block";
    case 8:
      return "d64 wgmma warp-specialised ping-pong, two consumer warpgroups (128 rows)";
    case 9:
      return "d256 wgmma warp-specialised ping-pong, block_n 64, 2 stages (library with a window "
             "or dropout)";
    case 10:
      return "d256 wgmma warp-specialised ping-pong, block_n 80, 2 stages (library otherwise)";
    default:
      return nullptr;
  }
}

int flash_variant_head_dim(int variant) {
  switch (variant) {
    case 6:
    case 7:
    case 8:
      return 64;
    case 9:
    case 10:
      return 256;
    default:
      return 128;
  }
}

void run_flash_variant(int variant, const AttentionProblem& p) {
  auto stream = static_cast<cudaStream_t>(p.stream);
  switch (variant) {
    case 0:
      return run_wgmma_ws<FlashSm90WsTraits<__nv_bfloat16, 128, 128>>(p, stream);
    case 1:
      return run_mma_sync<4, 64, 2>(p, stream);
    case 2:
      return run_wgmma_ws<FlashSm90WsTraits<__nv_bfloat16, 128, 128, 128, 2>>(p, stream);
    case 3:
      return run_wgmma_ws<FlashSm90WsTraits<__nv_bfloat16, 128, 128, 64, 3>>(p, stream);
    case 4:
      return run_wgmma_ws<FlashSm90WsTraits<__nv_bfloat16, 128, 128>>(p, stream, /*tma=*/false);
    case 5:
      return run_wgmma_ws<FlashSm90WsTraits<__nv_bfloat16, 128, 128>>(p, stream, /*tma=*/true,
                                                                      /*persistent=*/false);
    case 6:
      return run_wgmma_ws<FlashSm90WsTraits<__nv_bfloat16, 64, 64>>(p, stream);
    case 7:
      return run_wgmma_ws<FlashSm90WsTraits<__nv_bfloat16, 64, 64>>(p, stream, /*tma=*/true,
                                                                    /*persistent=*/false);
    case 8:
      return run_wgmma_ws<FlashSm90WsTraits<__nv_bfloat16, 64, 64, 128, 0, 2>>(p, stream);
    case 9:
      return run_wgmma_ws<FlashSm90WsTraits<__nv_bfloat16, 256, 256, 64, 2>>(p, stream);
    case 10:
      return run_wgmma_ws<FlashSm90WsTraits<__nv_bfloat16, 256, 256, 80, 2>>(p, stream);
    default:
      return;
  }
}

}  // namespace dpa::cuda
