// Compile-time tile shapes of the flash forward kernels, one per (element, head dims).
// Host-side choices that depend on the problem (split-KV) live in flash_tiles.h.
#pragma once

#include "cuda/flash/flash_tiles.h"

namespace dpa::cuda {

template <typename ElementT, int kHeadDimQKT, int kHeadDimVT>
struct FlashForwardTraits {
  using Element = ElementT;
  static constexpr int kHeadDimQK = kHeadDimQKT;
  static constexpr int kHeadDimV = kHeadDimVT;
  // Wide heads need 8 warps of 16 rows so that the O accumulator (16 x dv / 32 floats per
  // thread) stays in registers; narrow heads use 4 warps of 32 rows, which halves the
  // shared-memory reads of K and V per MMA (FlashAttention-2's choice for sm_80).
  static constexpr bool kWide = kHeadDimQK > 128 || kHeadDimV > 128;
  static constexpr int kWarps = kWide ? 8 : 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockM = 128;
  static constexpr int kSlabs = kBlockM / (16 * kWarps);
  static constexpr int kBlockN = 64;
  // 8 elements (16 bytes) of padding per row make the 8 row addresses of each ldmatrix fall
  // into distinct 16-byte bank groups for every head dim we instantiate.
  static constexpr int kPad = 8;
  static constexpr int kQStride = kHeadDimQK + kPad;
  static constexpr int kKStride = kHeadDimQK + kPad;
  static constexpr int kVStride = kHeadDimV + kPad;
  static constexpr int kSharedBytes =
      2 * (kBlockM * kQStride + kBlockN * kKStride + kBlockN * kVStride);
  static constexpr FlashTileShape kHostShape = flash_forward_tile_shape(kHeadDimQK, kHeadDimV);
  static_assert(kHostShape.block_m == kBlockM && kHostShape.block_n == kBlockN &&
                    kHostShape.warps == kWarps && kHostShape.shared_bytes == kSharedBytes,
                "host tile shape disagrees with the compiled traits");

  static_assert(kHeadDimQK % 16 == 0 && kHeadDimV % 16 == 0, "head dims must be multiples of 16");
  static_assert(kSlabs >= 1 && kSlabs * 16 * kWarps == kBlockM, "rows must tile the warps");
  static_assert(kBlockN % 16 == 0, "PV consumes 16 keys per MMA");
  // Must fit sm_80's 163 KB opt-in shared memory per block.
  static_assert(kSharedBytes <= 163 * 1024, "tile does not fit sm_80 shared memory");
};

}  // namespace dpa::cuda
