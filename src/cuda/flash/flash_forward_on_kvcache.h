// Decode-like forward calls of cuda_flash on the KV-cache attention kernel (docs/cuda_flash.md,
// "Decode on the KV-cache kernel"). That kernel packs every query head of a KV head into the
// rows of one block (GQA packing), so a step reads each key once; the flash forward's decode
// tiles hold one query head each and read every key once per query head.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/backend.h"
#include "core/problem.h"

namespace dpa::cuda {

// Whether a request's forward runs on the KV-cache kernel: a forward of at most
// kFlashDecodeMaxQueries queries per sequence, bshd or sbhd whose every sequence fills q's rows
// (its keys may be fewer than k's rows, as a contiguous cache's; explain() given shapes alone
// takes the sequences as full), no dropout, bias or CP tile, a head dim the kernel is built for (qk
// = v), float16 or bfloat16, rows on 16-byte boundaries, a diagonal the kernel can place
// (bottom-right, or nothing that depends on it), no kernel family asked for by the config, and
// tiles that fit `shared_memory_per_block` bytes.
bool forward_runs_on_kvcache_kernel(const FeatureRequest& request, size_t shared_memory_per_block);
// The same on the request's device.
bool forward_runs_on_kvcache_kernel(const FeatureRequest& request);

// The forward of a problem forward_runs_on_kvcache_kernel accepts: its k and v as a contiguous
// cache of max_seqlen_kv rows per sequence holding seqlen_kv[b] keys, nothing appended.
void run_forward_on_kvcache_kernel(const AttentionProblem& problem, cudaStream_t stream);
size_t forward_on_kvcache_workspace_bytes(const AttentionProblem& problem);

}  // namespace dpa::cuda
