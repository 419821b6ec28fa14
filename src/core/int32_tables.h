// The int32 tables of a call (cu_seqlens, cache_seqlens, block tables) read on the host, and the
// lengths a boundary table gives. Shared by the ordinary call's validation (problem_builder) and
// the KV-cache call's (kvcache_plan), so that both read and judge a table the same way.
#pragma once

#include <cstdint>
#include <vector>

#include "dpa/tensor.h"

namespace dpa {

// The entries of a 1-D int32 tensor on the host; a device tensor is copied first (ordered on
// `stream`, and it must be contiguous).
std::vector<int64_t> read_int32_vector(const TensorView& t, void* stream);

// Lengths [b] from boundaries [b + 1] that start at 0 and do not decrease; errors name `name`.
std::vector<int64_t> lengths_from_cu(const std::vector<int64_t>& cu, const char* name);

}  // namespace dpa
