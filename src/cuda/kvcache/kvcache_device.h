// A validated KV-cache call on device tensors (docs/kvcache.md): the append, the split-KV
// attention and the merge, enqueued on the call's stream with no host synchronisation.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "core/kvcache_plan.h"
#include "dpa/kvcache.h"

namespace dpa::cuda {

// Why this device cannot run the call's kernels (their shared memory at its head dim), or
// nullopt. Checked before anything is written.
std::optional<std::string> kvcache_device_refusal(const KvCachePlan& plan);

// Device scratch bytes the call takes from a caller's workspace (core/workspace.h): its split
// partials, aligned; 0 with one split.
size_t kvcache_workspace_bytes(const KvCachePlan& plan, const KvCacheConfig& config,
                               const KvCacheArgs& args);

// Preconditions: plan_kvcache accepted `args` (device tensors, the kernels' dtypes, head dims
// and alignment); the tables' contents are the caller's contract unless they were checked.
void run_kvcache_on_device(const KvCachePlan& plan, const KvCacheConfig& config,
                           const KvCacheArgs& args);

}  // namespace dpa::cuda
