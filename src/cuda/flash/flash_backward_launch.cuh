// The launch template shared by the per-head-dim backward translation units.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_check.h"
#include "cuda/flash/flash_backward_kernel.cuh"
#include "cuda/flash/flash_backward_launch.h"
#include "cuda/flash/flash_backward_rows.cuh"
#include "cuda/flash/flash_backward_sm90_one_kernel.cuh"
#include "cuda/flash/flash_backward_sm90_one_kernel_wide.cuh"
#include "dpa/error.h"

namespace dpa::cuda {

template <typename Kernel>
void launch_backward_kernel(Kernel kernel, dim3 grid, int threads, int shared_bytes,
                            const FlashBackwardParams& p, cudaStream_t stream) {
  // More than 48 KB of dynamic shared memory is opted into per function and device.
  DPA_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  kernel<<<grid, threads, shared_bytes, stream>>>(p);
  DPA_CUDA_CHECK_LAUNCH();
}

// The one-kernel backward (its wide form at head dims 192, 192 / 128 and 256), then the conversion
// of its dq workspace.
template <typename Element, int kHeadDimQK, int kHeadDimV>
void launch_flash_backward_one_kernel_sm90(const FlashBackwardParams& p, cudaStream_t stream) {
  const FlashForwardParams& f = p.fwd;
  const unsigned batch = unsigned(f.batch);
  const bool deterministic = p.dq_order != nullptr;
  // Deterministic mode: key blocks in chains of p.key_chain (deterministic_key_block).
  auto grid_of = [&](int block_n) {
    const int key_blocks = (f.max_seqlen_kv + block_n - 1) / block_n;
    const int chains = deterministic ? (key_blocks + p.key_chain - 1) / p.key_chain : 1;
    return dim3(unsigned(deterministic ? p.key_chain : key_blocks), unsigned(f.heads_kv),
                batch * unsigned(chains));
  };
  if constexpr (flash_backward_one_kernel_wide_eligible(kHeadDimQK, kHeadDimV)) {
    using Wide = FlashBackwardSm90OneKernelWideTraits<Element, kHeadDimQK, kHeadDimV>;
    auto kernel = deterministic ? flash_backward_one_kernel_wide_sm90_kernel<Wide, true, false>
                                : flash_backward_one_kernel_wide_sm90_kernel<Wide, false, false>;
    if constexpr (Wide::kTakesDropout) {
      if (f.dropout_threshold != 0)
        kernel = deterministic ? flash_backward_one_kernel_wide_sm90_kernel<Wide, true, true>
                               : flash_backward_one_kernel_wide_sm90_kernel<Wide, false, true>;
    } else if (f.dropout_threshold != 0) {
      // flash_backward_family keeps dropout off this form here; never drop it silently.
      throw Error(ErrorCode::kInternal, "dropout",
                  "the wide one-kernel backward at this head dim has no keep bits");
    }
    if (p.dq_tickets != nullptr)
      throw Error(ErrorCode::kInternal, "", "the wide one-kernel backward takes no dq tickets");
    if (p.query_tile_rows != Wide::kBlockM)
      throw Error(ErrorCode::kInternal, "",
                  "one-kernel backward's query_tile_rows disagrees with its form");
    if (f.max_seqlen_kv > 0)
      launch_backward_kernel(kernel, grid_of(Wide::kBlockN), Wide::kThreads, Wide::kSharedBytes, p,
                             stream);
  } else if constexpr (flash_backward_one_kernel_narrow_eligible(kHeadDimQK, kHeadDimV)) {
    // The forms differ in shared memory (the dropout form's keep words and, at d128, its one dU^T
    // buffer; the 128-row tiles' stages), so each has its traits; the host's tile rows
    // (flash_backward_plan's, also the tensor maps' boxes) pick one, and a value no form has is
    // refused.
    auto launch = [&](auto traits) {
      using Traits = decltype(traits);
      auto kernel = deterministic
                        ? flash_backward_one_kernel_sm90_kernel<Traits, Traits::kDropout, true>
                        : flash_backward_one_kernel_sm90_kernel<Traits, Traits::kDropout, false>;
      // Without tickets where the form takes them the kernel would read no ticket words; with
      // them where it does not, the unzeroed workspace would be summed into. Without query rows
      // there are no tiles, no tickets (nor deterministic mode's flags) and no iterations.
      if (f.max_seqlen_q > 0 &&
          (p.dq_tickets != nullptr) !=
              flash_backward_dq_takes_tickets(kHeadDimQK, kHeadDimV, Traits::kDropout,
                                              deterministic, Traits::kBlockM))
        throw Error(ErrorCode::kInternal, "",
                    "one-kernel backward's dq tickets disagree with its form");
      if (f.max_seqlen_kv > 0)
        launch_backward_kernel(kernel, grid_of(Traits::kBlockN), Traits::kThreads,
                               Traits::kSharedBytes, p, stream);
    };
    using Rows64 = FlashBackwardSm90OneKernelTraits<Element, kHeadDimQK, kHeadDimV, false, 64>;
    using Rows64Dropout =
        FlashBackwardSm90OneKernelTraits<Element, kHeadDimQK, kHeadDimV, true, 64>;
    constexpr bool kTakes128 =
        flash_backward_one_kernel_takes_128_rows(kHeadDimQK, kHeadDimV, false);
    using Rows128 = FlashBackwardSm90OneKernelTraits<Element, kHeadDimQK, kHeadDimV, false,
                                                     kTakes128 ? 128 : 64>;
    const bool dropout = f.dropout_threshold != 0;
    if (p.query_tile_rows == 64) {
      if (dropout)
        launch(Rows64Dropout{});
      else
        launch(Rows64{});
    } else if (kTakes128 && !dropout && p.query_tile_rows == 128) {
      launch(Rows128{});
    } else {
      throw Error(ErrorCode::kInternal, "",
                  "one-kernel backward's query_tile_rows disagrees with its forms");
    }
  } else {
    // The host sets p.one_kernel only where flash_backward_family allows it.
    throw Error(ErrorCode::kInternal, "",
                "one-kernel backward asked for head dims it does not take");
  }
  if (f.max_seqlen_q > 0) {
    if constexpr (flash_backward_one_kernel_wide_eligible(kHeadDimQK, kHeadDimV)) {
      flash_backward_convert_dq_kernel<Element, kHeadDimQK>
          <<<backward_row_grid(f.max_seqlen_q, f.heads_q, f.batch, kHeadDimQK),
             kBackwardRowBlockThreads, 0, stream>>>(p);
    } else if constexpr (flash_backward_one_kernel_narrow_eligible(kHeadDimQK, kHeadDimV)) {
      const dim3 grid(unsigned(dq_workspace_rows(f.max_seqlen_q) / kOneKernelBackwardBlockM),
                      unsigned(f.heads_q), unsigned(f.batch));
      flash_backward_convert_dq_fragments_kernel<Element, kHeadDimQK>
          <<<grid, kBackwardRowBlockThreads, 0, stream>>>(p);
    }
    DPA_CUDA_CHECK_LAUNCH();
  }
}

template <typename Element, int kHeadDimQK, int kHeadDimV>
void launch_flash_backward_element(const FlashBackwardParams& p, cudaStream_t stream) {
  using Traits = FlashBackwardTraits<Element, kHeadDimQK, kHeadDimV>;
  const FlashForwardParams& f = p.fwd;
  if (f.batch == 0 || f.heads_q == 0) return;
  const unsigned batch = unsigned(f.batch);
  if (f.max_seqlen_q > 0) {
    // Also zeroes the one-kernel family's dq workspace (p.dq_accum) where it takes no tickets;
    // its rows per head are rounded up to whole tiles.
    const bool zeroes = p.one_kernel && p.dq_tickets == nullptr;
    const int64_t rows = zeroes ? dq_workspace_rows(f.max_seqlen_q) : f.max_seqlen_q;
    flash_backward_prepare_kernel<Element, kHeadDimQK, kHeadDimV>
        <<<backward_row_grid(rows, f.heads_q, f.batch, kHeadDimV), kBackwardRowBlockThreads, 0,
           stream>>>(p);
    DPA_CUDA_CHECK_LAUNCH();
  }
  if (p.one_kernel)
    return launch_flash_backward_one_kernel_sm90<Element, kHeadDimQK, kHeadDimV>(p, stream);
  if (f.max_seqlen_q > 0) {
    const dim3 dq_grid(unsigned((f.max_seqlen_q + Traits::kDqBlockM - 1) / Traits::kDqBlockM),
                       unsigned(f.heads_q), batch);
    launch_backward_kernel(flash_backward_dq_kernel<Traits>, dq_grid, Traits::kThreads,
                           Traits::kDqSharedBytes, p, stream);
  }
  if (f.max_seqlen_kv > 0) {
    const dim3 dkdv_grid(unsigned((f.max_seqlen_kv + Traits::kDkvBlockN - 1) / Traits::kDkvBlockN),
                         unsigned(f.heads_kv), batch);
    if constexpr (Traits::kDkDvInOneLaunch) {
      launch_backward_kernel(flash_backward_dkdv_kernel<Traits, true, true>, dkdv_grid,
                             Traits::kThreads, Traits::kDkvSharedBytes, p, stream);
    } else {
      launch_backward_kernel(flash_backward_dkdv_kernel<Traits, true, false>, dkdv_grid,
                             Traits::kThreads, Traits::kDkvSharedBytes, p, stream);
      launch_backward_kernel(flash_backward_dkdv_kernel<Traits, false, true>, dkdv_grid,
                             Traits::kThreads, Traits::kDkvSharedBytes, p, stream);
    }
  }
}

template <int kHeadDimQK, int kHeadDimV>
void launch_flash_backward_dims(const FlashBackwardParams& p, DType dtype, cudaStream_t stream) {
  if (dtype == DType::kBFloat16)
    launch_flash_backward_element<__nv_bfloat16, kHeadDimQK, kHeadDimV>(p, stream);
  else
    launch_flash_backward_element<__half, kHeadDimQK, kHeadDimV>(p, stream);
}

}  // namespace dpa::cuda
