// Launches of the KV-cache kernels (kvcache_kernels.cuh), by dtype and head dim.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/kvcache/kvcache_params.h"
#include "dpa/types.h"

namespace dpa::cuda {

// The attention kernel's pipeline stages: the default, and the deeper one taken when the keys
// are split (kvcache_device.cc says why). Each is compiled; other counts are not.
int kvcache_default_stages(int head_dim);
int kvcache_split_stages(int head_dim);

// Blocks of the attention kernel at `stages` that fit on one SM at once (its shared memory
// decides).
int kvcache_blocks_per_sm(int head_dim, int stages);

// Dynamic shared memory of one attention block (d = 256: 137 KiB at its default stages, more
// than the 99 KiB a block may take on sm_86 / sm_89 / sm_120).
int kvcache_shared_bytes(int head_dim, int stages);

// k_new / v_new into the cache; `max_new_rows` bounds any sequence's new tokens (grid size only:
// the kernel strides over what the tables give).
void launch_kvcache_append(const KvCacheParams& p, DType dtype, int head_dim_qk, int head_dim_v,
                           int64_t max_new_rows, cudaStream_t stream);

// The attention: p.batch * p.heads_kv * p.num_splits blocks along x, `row_blocks` along y (each
// strides over its sequence's packed rows, so any count is correct); `stages` is one of the two
// above.
void launch_kvcache_attention(const KvCacheParams& p, DType dtype, int head_dim, int stages,
                              unsigned row_blocks, cudaStream_t stream);

// The merge of p.num_splits > 1 partials; `max_queries` bounds any sequence's queries (grid
// size only). `programmatic` (sm_90 and newer): launched as the preceding attention kernel's
// programmatic dependent, so that its launch overlaps that kernel's last blocks (the merge
// waits for the whole grid before it reads the partials).
void launch_kvcache_merge(const KvCacheParams& p, DType dtype, int head_dim_v, int64_t max_queries,
                          bool programmatic, cudaStream_t stream);

// The sequence tables of the flash forward (FlashForwardParams) for a prefill call on it, after
// the append: `tables` holds 3 * p.batch ints, seqlen_q, then seqlen_kv (the keys after the
// append), then the diagonal (keys - queries: the bottom-right alignment).
void launch_kvcache_flash_tables(const KvCacheParams& p, int* tables, cudaStream_t stream);

}  // namespace dpa::cuda
