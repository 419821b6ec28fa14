// The wgmma operand descriptors of the sm90 forward (flash_forward_sm90_ws.cuh): built once from
// the shared-memory layout, then advanced by constants per wgmma (ptx::advance_descriptor), one
// uniform add each instead of masking and shifting every operand's address again.
#pragma once

#include <cstdint>

#include "cuda/ptx/wgmma.cuh"

namespace dpa::cuda {

template <typename Traits>
struct ForwardDescriptors {
  uint64_t q;  // the warpgroup's 64 rows of Q in buffer 0
  uint64_t k;  // stage 0 of K
  uint64_t v;  // stage 0 of V

  // `q_rows`: the shared address of the warpgroup's first Q row. `q_rows` should derive from a
  // warp-uniform warpgroup index (a lane-0 broadcast): the descriptors then live in uniform
  // registers.
  __device__ __forceinline__ ForwardDescriptors(uint32_t q_rows, uint32_t k_stage0,
                                                uint32_t v_stage0)
      : q(ptx::smem_descriptor(q_rows, 16, 1024)),
        k(ptx::smem_descriptor(k_stage0, 16, 1024)),
        v(ptx::smem_descriptor(v_stage0, Traits::kBlockN * 128, 1024)) {}

  // K-major operands (Q, K) advance 32 bytes per 16 columns inside a 64-column block and one
  // block (rows x 128 bytes) per 64 columns; V (MN-major) advances 16 rows per k-step. A stage's
  // descriptor is taken first, so that each k-step adds only a constant.
  __device__ __forceinline__ uint64_t q_at(int buffer, int kk) const {
    const uint64_t q_buffer = ptx::advance_descriptor(q, uint32_t(buffer) * Traits::kQBytes);
    return ptx::advance_descriptor(q_buffer, (kk / 4) * (Traits::kBlockM * 128) + (kk % 4) * 32);
  }
  __device__ __forceinline__ uint64_t k_at(int stage, int kk) const {
    const uint64_t k_stage = ptx::advance_descriptor(k, uint32_t(stage) * Traits::kKBytes);
    return ptx::advance_descriptor(k_stage, (kk / 4) * (Traits::kBlockN * 128) + (kk % 4) * 32);
  }
  __device__ __forceinline__ uint64_t v_at(int stage, int kk) const {
    const uint64_t v_stage = ptx::advance_descriptor(v, uint32_t(stage) * Traits::kVBytes);
    return ptx::advance_descriptor(v_stage, kk * 16 * 128);
  }
};

}  // namespace dpa::cuda
