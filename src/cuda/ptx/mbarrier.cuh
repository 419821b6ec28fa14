// Thin wrappers over the sm_90 synchronisation PTX the warp-specialised kernels use:
// shared-memory mbarriers (arrive counts and phase parity, arrivals on cp.async completion),
// the generic-to-async proxy fence, named barriers, setmaxnreg.
#pragma once

#include <cstdint>

namespace dpa::cuda::ptx {

__device__ __forceinline__ void mbarrier_init(uint32_t barrier, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(arrivals)
               : "memory");
}

// Arrives once (release semantics: this thread's earlier writes are visible to a waiter that
// observes the phase complete).
__device__ __forceinline__ void mbarrier_arrive(uint32_t barrier) {
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(barrier)
      : "memory");
}

// Arrives once when every cp.async this thread issued so far has landed, without blocking
// (.noinc: the arrival counts against the count the barrier was initialised with).
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint32_t barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(barrier) : "memory");
}

// Blocks until the phase with this parity has completed (acquire semantics).
__device__ __forceinline__ void mbarrier_wait(uint32_t barrier, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred complete;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "selp.u32 %0, 1, 0, complete;\n}\n"
        : "=r"(done)
        : "r"(barrier), "r"(parity)
        : "memory");
  }
}

// A word that one thread stores in shared memory before an mbarrier arrival and others load
// after their wait: the asm's memory clobbers keep both on their side of the barrier, whose
// release and acquire order them. A shared-window address keeps it 32 bits (a generic pointer
// cost the 24-register producer warpgroup spills).
__device__ __forceinline__ void shared_store(uint32_t address, int value) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(value) : "memory");
}
__device__ __forceinline__ int shared_load(uint32_t address) {
  int value;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(address) : "memory");
  return value;
}

// Adds to a global counter and returns its value before (relaxed, GPU scope).
__device__ __forceinline__ int global_fetch_add(int* counter, int value) {
  int before;
  asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], %2;\n"
               : "=r"(before)
               : "l"(counter), "r"(value)
               : "memory");
  return before;
}

// Orders this thread's generic-proxy shared-memory accesses (cp.async, st.shared, ldmatrix reads)
// before its later async-proxy ones (wgmma reads, bulk copies into or out of the same bytes);
// follow it with a barrier where other threads' accesses must be ordered too.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Orders this thread's completed async-proxy writes to global memory (a bulk reduction waited
// for with bulk_wait_group<0>) before its later generic-proxy accesses, such as the releasing
// store that hands the sums on.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// Named barrier `id` (1..15; 0 is __syncthreads) for `threads` threads: sync waits, arrive
// does not.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The same for threads that reach the barrier at different instructions (two instantiations of
// one body): `bar.sync` is `barrier.sync.aligned`, which PTX requires every participating thread
// to execute at the same instruction (compute-sanitizer's synccheck reports "Divergent
// thread(s) in block" otherwise); `barrier.sync` without .aligned does not.
__device__ __forceinline__ void named_barrier_sync_unaligned(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// named_barrier_sync that also returns whether `value` was true in any of the threads.
__device__ __forceinline__ bool named_barrier_sync_or(int id, int threads, bool value) {
  int any;
  asm volatile(
      "{\n .reg .pred given, result;\n setp.ne.s32 given, %1, 0;\n"
      " bar.red.or.pred result, %2, %3, given;\n selp.s32 %0, 1, 0, result;\n}\n"
      : "=r"(any)
      : "r"(int(value)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive_unaligned(int id, int threads) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Moves registers between the warpgroups of a block (every thread of the warpgroup executes it).
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace dpa::cuda::ptx
