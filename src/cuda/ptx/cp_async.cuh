// cp.async wrappers (sm_80+): 16-byte global -> shared copies that bypass registers, grouped
// into commit groups so loads of the next tile overlap math on the current one.
#pragma once

#include <cstdint>

namespace dpa::cuda::ptx {

// Copies 16 bytes, or writes 16 zero bytes when `valid` is false (src-size 0), so tiles that
// run past the end of a sequence read zeros instead of out-of-bounds memory.
__device__ __forceinline__ void cp_async_16(uint32_t shared_destination, const void* global_source,
                                            bool valid) {
  const int source_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_destination),
               "l"(global_source), "r"(source_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` of this thread's most recent groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace dpa::cuda::ptx
