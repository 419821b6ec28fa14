// Compile-time tile shapes of the flash forward kernels, one per (element, head dims).
// Host-side choices that depend on the problem (split-KV) live in flash_tiles.h.
#pragma once

#include "cuda/flash/flash_tiles.h"

namespace dpa::cuda {

// kWarpsT and kBlockNT default to flash_forward_tile_shape's choice (what the library runs);
// dev benches instantiate other values to compare tile shapes.
template <typename ElementT, int kHeadDimQKT, int kHeadDimVT,
          int kWarpsT = flash_forward_tile_shape(kHeadDimQKT, kHeadDimVT).warps,
          int kBlockNT = flash_forward_tile_shape(kHeadDimQKT, kHeadDimVT).block_n,
          int kSlabsT = flash_forward_tile_shape(kHeadDimQKT, kHeadDimVT).slabs>
struct FlashForwardTraits {
  using Element = ElementT;
  static constexpr int kHeadDimQK = kHeadDimQKT;
  static constexpr int kHeadDimV = kHeadDimVT;
  static constexpr int kWarps = kWarpsT;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kSlabs = kSlabsT;  // 16-row slabs per warp
  static constexpr int kBlockM = 16 * kWarps * kSlabs;
  static constexpr int kBlockN = kBlockNT;
  // 8 elements (16 bytes) of padding per row make the 8 row addresses of each ldmatrix fall
  // into distinct 16-byte bank groups for every head dim we instantiate.
  static constexpr int kPad = 8;
  static constexpr int kQStride = kHeadDimQK + kPad;
  static constexpr int kKStride = kHeadDimQK + kPad;
  static constexpr int kVStride = kHeadDimV + kPad;
  static constexpr int kSharedBytes =
      2 * (kBlockM * kQStride + kBlockN * kKStride + kBlockN * kVStride);

  static_assert(kHeadDimQK % 16 == 0 && kHeadDimV % 16 == 0, "head dims must be multiples of 16");
  static_assert(kSlabs >= 1, "every warp owns at least one 16-row slab");
  static_assert(kBlockN % 16 == 0, "PV consumes 16 keys per MMA");
  // Must fit sm_80's 163 KB opt-in shared memory per block.
  static_assert(kSharedBytes <= 163 * 1024, "tile does not fit sm_80 shared memory");
};

// One warp of 16 query rows: the decode shape (flash_forward_tile_shape(.., decode = true)).
template <typename Element, int kHeadDimQK, int kHeadDimV>
using FlashDecodeTraits =
    FlashForwardTraits<Element, kHeadDimQK, kHeadDimV,
                       flash_forward_tile_shape(kHeadDimQK, kHeadDimV, true).warps,
                       flash_forward_tile_shape(kHeadDimQK, kHeadDimV, true).block_n,
                       flash_forward_tile_shape(kHeadDimQK, kHeadDimV, true).slabs>;

}  // namespace dpa::cuda
