// Small host-to-device uploads (sequence tables, pointer tables) whose host memory may be
// released as soon as the upload returns, in eager calls and under CUDA graph capture alike.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace dpa::cuda {

// Copies `bytes` bytes from `host` to `device` in `stream`'s order. Eagerly by cudaMemcpyAsync:
// the driver stages pageable memory before it returns. While the stream captures a graph, by
// kernels that carry the bytes as arguments (4080 bytes per launch): a graph replays a captured
// pageable copy as a copy from the same host address, which the caller no longer owns after
// the call, whereas a kernel's arguments are copied into the graph when it is captured.
void upload_bytes(void* device, const void* host, size_t bytes, cudaStream_t stream);

}  // namespace dpa::cuda
