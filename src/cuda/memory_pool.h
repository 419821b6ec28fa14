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

// The pool of `stream`'s device (the legacy default stream: the current device), created on
// first use; nullptr where the device has no memory pools or the driver refuses one, in which
// case the caller takes the default pool. Under graph capture (memory_pool.cc says why) the
// current device's.
cudaMemPool_t library_memory_pool(cudaStream_t stream);

}  // namespace dpa::cuda
