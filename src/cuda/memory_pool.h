// The library's stream-ordered memory pool (one per device), from which DeviceBuffer takes its
// own allocations. The driver's default pool has a release threshold of 0: at every
// synchronisation it hands its free memory back to the system, so a call that allocates
// (split-KV partials, device CP chunk sets) pays to map its memory again after each
// synchronising caller. This pool keeps up to kLibraryPoolKeptBytes of freed memory for
// reuse instead, without touching the process's default pool, which other libraries share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace dpa::cuda {

constexpr size_t kLibraryPoolKeptBytes = size_t(4) << 30;

// The pool of the current device, created on first use; nullptr where the device has no memory
// pools or the driver refuses one, in which case the caller takes the default pool. The current
// device is the call's stream's wherever the call can run (a kernel launch fails on a stream of
// another device). cudaStreamGetDevice is not asked: a stream capturing a CUDA graph in the
// global or thread-local mode (torch.cuda.graph's default is global) refuses it.
cudaMemPool_t library_memory_pool();

}  // namespace dpa::cuda
