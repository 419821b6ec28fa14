// Instantiations and launches of the KV-cache kernels: fp16 and bf16, head dims 64, 128, 256.
#include <algorithm>

#include "cuda/cuda_check.h"
#include "cuda/kvcache/kvcache_kernels.cuh"
#include "cuda/kvcache/kvcache_launch.h"

namespace dpa::cuda {
namespace {

constexpr int kWarpsPerRowBlock = 8;  // append: one warp per row

unsigned capped_blocks(int64_t rows) {
  const int64_t blocks = (rows + kWarpsPerRowBlock - 1) / kWarpsPerRowBlock;
  return unsigned(std::clamp<int64_t>(blocks, 1, 65535));
}

template <typename Element, int kDim, int kStages>
void launch_attention(const KvCacheParams& p, unsigned row_blocks, cudaStream_t stream) {
  constexpr int bytes = KvCacheTiles<kDim, kStages>::kSharedBytes;
  auto kernel = kvcache_attention_kernel<Element, kDim, kStages>;
  DPA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  const dim3 grid(unsigned(int64_t(p.batch) * p.heads_kv * p.num_splits), row_blocks);
  kernel<<<grid, kKvThreads, bytes, stream>>>(p);
  DPA_CUDA_CHECK_LAUNCH();
}

// The compiled stage counts of one head dim: its default and its split one.
template <typename Element, int kDim>
void launch_attention_staged(const KvCacheParams& p, int stages, unsigned row_blocks,
                             cudaStream_t stream) {
  if (stages == kv_split_stages(kDim))
    return launch_attention<Element, kDim, kv_split_stages(kDim)>(p, row_blocks, stream);
  return launch_attention<Element, kDim, kv_default_stages(kDim)>(p, row_blocks, stream);
}

template <typename Element>
void launch_attention_for(const KvCacheParams& p, int head_dim, int stages, unsigned row_blocks,
                          cudaStream_t stream) {
  if (head_dim == 64) return launch_attention_staged<Element, 64>(p, stages, row_blocks, stream);
  if (head_dim == 128) return launch_attention_staged<Element, 128>(p, stages, row_blocks, stream);
  return launch_attention_staged<Element, 256>(p, stages, row_blocks, stream);
}

template <int kDim, int kStages>
int blocks_per_sm() {
  constexpr int bytes = KvCacheTiles<kDim, kStages>::kSharedBytes;
  auto kernel = kvcache_attention_kernel<__half, kDim, kStages>;
  DPA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  int blocks = 0;
  DPA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kKvThreads, bytes));
  return std::max(1, blocks);
}

// Both dtypes have 16-bit elements: the same shared memory, the same occupancy. Each variant is
// asked only where its shared memory fits (a device without the opt-in shared memory of d = 256
// must still run d = 64; kvcache_shared_bytes lets the caller refuse first). The first device asked
// decides (a machine of mixed GPUs gets that device's occupancy: a speed question only).
template <int kDim>
int blocks_per_sm_staged(int stages) {
  if (stages == kv_split_stages(kDim)) {
    static const int blocks = blocks_per_sm<kDim, kv_split_stages(kDim)>();
    return blocks;
  }
  static const int blocks = blocks_per_sm<kDim, kv_default_stages(kDim)>();
  return blocks;
}

template <int kDim>
int shared_bytes_staged(int stages) {
  return stages == kv_split_stages(kDim) ? KvCacheTiles<kDim, kv_split_stages(kDim)>::kSharedBytes
                                         : KvCacheTiles<kDim>::kSharedBytes;
}

// The flash forward's sequence tables of a call (kvcache_launch.h), one thread per sequence.
__global__ void kvcache_flash_tables_kernel(const KvCacheParams p, int* seqlen_q, int* seqlen_kv,
                                            int* diagonal) {
  for (int b = int(blockIdx.x * blockDim.x + threadIdx.x); b < p.batch;
       b += int(gridDim.x * blockDim.x)) {
    const KvSequence s = kv_sequence(p, b);
    seqlen_q[b] = s.queries;
    seqlen_kv[b] = s.keys;
    diagonal[b] = s.keys - s.queries;  // query i sits at position i + keys - queries
  }
}

}  // namespace

int kvcache_default_stages(int head_dim) { return kv_default_stages(head_dim); }
int kvcache_split_stages(int head_dim) { return kv_split_stages(head_dim); }

int kvcache_blocks_per_sm(int head_dim, int stages) {
  if (head_dim == 64) return blocks_per_sm_staged<64>(stages);
  if (head_dim == 128) return blocks_per_sm_staged<128>(stages);
  return blocks_per_sm_staged<256>(stages);
}

int kvcache_shared_bytes(int head_dim, int stages) {
  if (head_dim == 64) return shared_bytes_staged<64>(stages);
  if (head_dim == 128) return shared_bytes_staged<128>(stages);
  return shared_bytes_staged<256>(stages);
}

void launch_kvcache_append(const KvCacheParams& p, DType dtype, int head_dim_qk, int head_dim_v,
                           int64_t max_new_rows, cudaStream_t stream) {
  const dim3 grid(capped_blocks(max_new_rows * p.heads_kv), unsigned(p.batch));
  const int threads = 32 * kWarpsPerRowBlock;
  if (dtype == DType::kBFloat16)
    kvcache_append_kernel<__nv_bfloat16><<<grid, threads, 0, stream>>>(p, head_dim_qk, head_dim_v);
  else
    kvcache_append_kernel<__half><<<grid, threads, 0, stream>>>(p, head_dim_qk, head_dim_v);
  DPA_CUDA_CHECK_LAUNCH();
}

void launch_kvcache_attention(const KvCacheParams& p, DType dtype, int head_dim, int stages,
                              unsigned row_blocks, cudaStream_t stream) {
  if (dtype == DType::kBFloat16)
    launch_attention_for<__nv_bfloat16>(p, head_dim, stages, row_blocks, stream);
  else
    launch_attention_for<__half>(p, head_dim, stages, row_blocks, stream);
}

void launch_kvcache_merge(const KvCacheParams& p, DType dtype, int head_dim_v, int64_t max_queries,
                          bool programmatic, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim =
      dim3(unsigned(std::clamp<int64_t>(max_queries * p.heads_q, 1, 65535)), unsigned(p.batch));
  config.blockDim = dim3(kMergeThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
  if (dtype == DType::kBFloat16)
    DPA_CUDA_CHECK(cudaLaunchKernelEx(&config, kvcache_merge_kernel<__nv_bfloat16>, p, head_dim_v));
  else
    DPA_CUDA_CHECK(cudaLaunchKernelEx(&config, kvcache_merge_kernel<__half>, p, head_dim_v));
}

void launch_kvcache_flash_tables(const KvCacheParams& p, int* tables, cudaStream_t stream) {
  constexpr int kThreads = 128;
  const unsigned blocks =
      unsigned(std::clamp<int64_t>((p.batch + kThreads - 1) / kThreads, 1, 1024));
  kvcache_flash_tables_kernel<<<blocks, kThreads, 0, stream>>>(p, tables, tables + p.batch,
                                                               tables + 2 * p.batch);
  DPA_CUDA_CHECK_LAUNCH();
}

}  // namespace dpa::cuda
