// The launch template shared by the per-head-dim translation units.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/cuda_check.h"
#include "cuda/flash/flash_forward_kernel.cuh"
#include "cuda/flash/flash_forward_launch.h"
#include "cuda/flash/flash_forward_sm90_ws.cuh"
#include "cuda/flash/merge_partials.cuh"
#include "dpa/error.h"

namespace dpa::cuda {

template <typename Traits, typename Kernel>
void launch_flash_forward_kernel(Kernel kernel, const FlashForwardParams& p, cudaStream_t stream) {
  // Opting in to more than 48 KB of dynamic shared memory is per function and per device;
  // setting it on every launch is cheap and stays right when the current device changes.
  DPA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      Traits::kSharedBytes));
  const dim3 grid(unsigned((p.max_seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM),
                  unsigned(p.heads_q), unsigned(p.batch * p.num_splits));
  kernel<<<grid, Traits::kThreads, Traits::kSharedBytes, stream>>>(p);
  DPA_CUDA_CHECK_LAUNCH();
}

// The warp-specialised kernel's one-dimensional grid over the blocks of work
// (flash_forward_sm90_ws.cuh): one block per block of work, or at most p.persistent_blocks
// looping over them.
template <typename Traits, typename Kernel>
void launch_flash_forward_ws_kernel(Kernel kernel, const FlashForwardParams& p,
                                    cudaStream_t stream) {
  constexpr bool kPowerOfTwoTile = (Traits::kBlockN & (Traits::kBlockN - 1)) == 0;
  if (!kPowerOfTwoTile && p.block_table)
    throw Error(ErrorCode::kInternal, "block_table",
                "paged K/V on a tile of a key count that is not a power of two");
  if (!kPowerOfTwoTile && p.dropout_threshold != 0)
    throw Error(ErrorCode::kInternal, "dropout",
                "dropout on a tile of a key count that is not a power of two");
  // The TMA producer gives each lane of a warp one page's box of a paged key tile.
  if (p.block_table && p.tma &&
      (!p.tma_tails || Traits::kBlockN / std::min(1 << p.page_shift, Traits::kBlockN) > 32))
    throw Error(ErrorCode::kInternal, "block_table",
                "paged TMA tiles without the producer's whole warp or of more than 32 pages");
  // The kernel's dynamic scheduler has one producer thread publish each block of work.
  if (p.tile_counter && (!p.tma || p.tma_tails || p.block_table || p.persistent_blocks <= 0))
    throw Error(
        ErrorCode::kInternal, "tile_counter",
        "dynamic scheduling planned without a one-thread TMA producer or a persistent grid");
  DPA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      Traits::kSharedBytes));
  if (p.packed_heads > 1 && (!p.tma || Traits::kBlockM % (16 * p.packed_heads) != 0))
    throw Error(ErrorCode::kInternal, "packed_heads",
                "GQA packing planned without TMA or for a block it does not divide into slabs");
  // The kernel's blocks of work (flash_forward_sm90_ws.cuh): query blocks x head groups x
  // batch x splits.
  const int block_positions = Traits::kBlockM / p.packed_heads;
  const int64_t work = int64_t((p.max_seqlen_q + block_positions - 1) / block_positions) *
                       (p.heads_q / p.packed_heads) * p.batch * p.num_splits;
  const int64_t blocks =
      p.persistent_blocks > 0 ? std::min<int64_t>(work, p.persistent_blocks) : work;
  kernel<<<unsigned(blocks), Traits::kThreads, Traits::kSharedBytes, stream>>>(p);
  DPA_CUDA_CHECK_LAUNCH();
}

// The warp-specialised kernel compiled for the problem's logit form
// (flash_forward_logit_form) where its head dims and element type have one, else the general
// kernel, which takes every problem.
template <typename Traits>
void launch_flash_forward_ws(const FlashForwardParams& p, cudaStream_t stream) {
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  const FlashLogitForm form =
      flash_forward_logit_form(kDimQK, kDimV, p.use_softcap, p.softcap_fixed_max,
                               p.alibi_slopes != nullptr, p.dropout_threshold != 0);
  if constexpr (flash_forward_has_plain_logits(kDimQK, kDimV)) {
    if (form == FlashLogitForm::kPlain)
      return launch_flash_forward_ws_kernel<Traits>(
          flash_forward_sm90_ws_kernel<Traits, FlashLogitForm::kPlain>, p, stream);
  }
  if constexpr (flash_forward_has_softcap_logits(kDimQK, kDimV) &&
                std::is_same_v<typename Traits::Element, __nv_bfloat16>) {
    if (form == FlashLogitForm::kSoftcapFixedMax)
      return launch_flash_forward_ws_kernel<Traits>(
          flash_forward_sm90_ws_kernel<Traits, FlashLogitForm::kSoftcapFixedMax>, p, stream);
  }
  launch_flash_forward_ws_kernel<Traits>(
      flash_forward_sm90_ws_kernel<Traits, FlashLogitForm::kGeneral>, p, stream);
}

template <typename Traits>
void launch_flash_forward_traits(const FlashForwardParams& p, cudaStream_t stream) {
  launch_flash_forward_kernel<Traits>(flash_forward_kernel<Traits>, p, stream);
}

template <typename Element, int kHeadDimQK, int kHeadDimV>
void launch_flash_forward_element(const FlashForwardParams& p, bool decode, cudaStream_t stream) {
  // Paged K and V: only the warp-specialised kernel reads the page table, and with TMA its
  // tiles that cross a sequence's end need the cp.async tails (a cache's rows past the sequence
  // are stale, not zeros).
  if (p.block_table && !(p.wgmma && p.warp_specialized && (!p.tma || p.tma_tails)))
    throw Error(ErrorCode::kInternal, "block_table",
                "paged K/V planned for a flash kernel that cannot read pages");
  if constexpr (flash_forward_wgmma_eligible(kHeadDimQK, kHeadDimV)) {
    if (p.wgmma && p.warp_specialized) {
      using Traits = FlashSm90WsTraits<Element, kHeadDimQK, kHeadDimV>;
      // GQA packing's tile (flash_forward_packs_gqa): kFlashPackedConsumers consumers on 64-key
      // tiles at head dim 64.
      if constexpr (kHeadDimQK == 64 && kHeadDimV == 64) {
        if (p.block_n == kFlashPackedBlockN && p.consumer_warpgroups == kFlashPackedConsumers)
          return launch_flash_forward_ws<FlashSm90WsTraits<
              Element, kHeadDimQK, kHeadDimV, kFlashPackedBlockN, 0, kFlashPackedConsumers>>(
              p, stream);
      }
      // Head dims whose key tile is not the base tile's (flash_forward_wgmma_tile_shape) also
      // have that one, for windows and dropout (flash_forward_wgmma_ws_block_n).
      constexpr int kPlainBlockN = flash_forward_wgmma_tile_shape(kHeadDimQK, kHeadDimV).block_n;
      if constexpr (Traits::kBlockN != kPlainBlockN) {
        if (p.block_n == kPlainBlockN)
          return launch_flash_forward_ws<
              FlashSm90WsTraits<Element, kHeadDimQK, kHeadDimV, kPlainBlockN>>(p, stream);
      }
      if (p.block_n != Traits::kBlockN)
        throw Error(ErrorCode::kInternal, "block_n",
                    "planned " + std::to_string(p.block_n) +
                        "-key tiles, the head dims have a kernel with " +
                        std::to_string(Traits::kBlockN));
      // Head dims that take three consumer warpgroups also have two, for narrow windows
      // (flash_forward_wgmma_ws_consumers).
      if constexpr (Traits::kConsumers == 3) {
        if (p.consumer_warpgroups == 2) {
          using Two = FlashSm90WsTraits<Element, kHeadDimQK, kHeadDimV, Traits::kBlockN, 0, 2>;
          return launch_flash_forward_ws<Two>(p, stream);
        }
      }
      if (p.consumer_warpgroups != Traits::kConsumers)
        throw Error(ErrorCode::kInternal, "consumer_warpgroups",
                    "planned " + std::to_string(p.consumer_warpgroups) +
                        " consumer warpgroups, the head dims have a kernel with " +
                        std::to_string(Traits::kConsumers));
      return launch_flash_forward_ws<Traits>(p, stream);
    }
  }
  // Every wgmma plan is the warp-specialised form's (flash_forward_shape): the plain
  // two-warpgroup kernel went in session 32, once no head dim ran it by default.
  if (p.wgmma)
    throw Error(ErrorCode::kInternal, "wgmma",
                "a wgmma plan without the warp-specialised form, or for head dims without it");
  if (decode)
    launch_flash_forward_traits<FlashDecodeTraits<Element, kHeadDimQK, kHeadDimV>>(p, stream);
  else
    launch_flash_forward_traits<FlashForwardTraits<Element, kHeadDimQK, kHeadDimV>>(p, stream);
}

// Runs the kernel and tile shape the plan was made for (p.wgmma, p.decode) and merges split-KV
// partials.
template <int kHeadDimQK, int kHeadDimV>
void launch_flash_forward_dims(const FlashForwardParams& p, DType dtype, cudaStream_t stream) {
  if (dtype == DType::kBFloat16)
    launch_flash_forward_element<__nv_bfloat16, kHeadDimQK, kHeadDimV>(p, p.decode, stream);
  else
    launch_flash_forward_element<__half, kHeadDimQK, kHeadDimV>(p, p.decode, stream);
  if (p.num_splits > 1) launch_merge_partials(p, dtype, kHeadDimV, stream);
}

}  // namespace dpa::cuda
