#include <cstring>

#include "cuda/cuda_check.h"
#include "cuda/host_upload.h"
#include "cuda/runtime.h"

namespace dpa::cuda {
namespace {

// The chunk, the destination and the count within 4 KB, the limit of a kernel's arguments
// before CUDA 12.1; more than a call's sequence tables need at the batch sizes that capture
// graphs (7 int32 per sequence).
constexpr size_t kChunkBytes = 4096 - 16;

struct Chunk {
  unsigned char bytes[kChunkBytes];
};

__global__ void write_chunk_kernel(unsigned char* destination, int count,
                                   const __grid_constant__ Chunk chunk) {
  for (int i = threadIdx.x; i < count; i += blockDim.x) destination[i] = chunk.bytes[i];
}

}  // namespace

void upload_bytes(void* device, const void* host, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  if (!stream_is_capturing(stream)) {
    DPA_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream));
    return;
  }
  auto* destination = static_cast<unsigned char*>(device);
  const auto* source = static_cast<const unsigned char*>(host);
  for (size_t done = 0; done < bytes; done += kChunkBytes) {
    const size_t count = bytes - done < kChunkBytes ? bytes - done : kChunkBytes;
    Chunk chunk;
    std::memcpy(chunk.bytes, source + done, count);
    write_chunk_kernel<<<1, 256, 0, stream>>>(destination + done, int(count), chunk);
    DPA_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace dpa::cuda
