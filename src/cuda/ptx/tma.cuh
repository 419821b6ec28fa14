// Thin wrappers over the sm_90 bulk copy PTX (TMA): a 4-d tile load from global to shared memory
// that completes on an mbarrier's transaction count, the plain (non-tensor) bulk copy, the
// barrier's expect-tx arrive, the bulk fp32 reduction into global memory with its group waits,
// the async-proxy fence and the tensor-map prefetch. The tensor maps
// come from cuda/tensor_map.h (host side).
#pragma once

#include <cstdint>

namespace dpa::cuda::ptx {

// Arrives once and raises the phase's expected transaction bytes by `bytes`: the phase
// completes when every arrival came and that many bytes of bulk copies landed.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t barrier, uint32_t bytes) {
  asm volatile(
      "{\n.reg .b64 state;\n"
      "mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(barrier),
      "r"(bytes)
      : "memory");
}

// Copies the box at coordinates (c0, c1, c2, c3) (innermost first, elements) of the tensor map
// `map` (a __grid_constant__ kernel parameter's address) to `shared_box`; its bytes count
// against `barrier`'s transaction count. Elements outside the tensor land as zeros.
__device__ __forceinline__ void tma_load_4d(uint32_t shared_box, const void* map, int c0, int c1,
                                            int c2, int c3, uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(shared_box),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(barrier)
      : "memory");
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory
// as one bulk copy (no tensor map: a row of a gathered page); its bytes count against
// `barrier`'s transaction count.
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t shared_destination,
                                                    const void* global_source, uint32_t bytes,
                                                    uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(shared_destination),
      "l"(global_source), "r"(bytes), "r"(barrier)
      : "memory");
}

// Adds `bytes` (a multiple of 16; both addresses 16-byte aligned) of fp32 from shared memory to
// global memory element by element, as one bulk reduction (the adds happen at L2), in this
// thread's open bulk group (bulk_commit_group closes it). The shared bytes must be written
// before it through the async proxy's view (fence_proxy_async_shared after generic stores).
__device__ __forceinline__ void bulk_reduce_add_f32(float* global_destination,
                                                    uint32_t shared_source, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   global_destination),
               "r"(shared_source), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's bulk groups still read their shared source.
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Waits until at most kPending of this thread's bulk groups are incomplete (their writes made).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Fetches a tensor map's descriptor ahead of its first use.
__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace dpa::cuda::ptx
