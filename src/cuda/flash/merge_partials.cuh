// The LSE merge primitive (DESIGN.md §8): partial attention results over disjoint KV ranges
// combine in fp32 as LSE = logaddexp(LSE_a, LSE_b), o = o_a exp(LSE_a - LSE) + o_b exp(...).
// The sink joins once, here, as one more partial with LSE sigma_h and o = 0. Split-KV decode
// uses it today; context parallelism reuses it.
#pragma once

#include <cuda_runtime_api.h>

#include "core/problem.h"
#include "cuda/flash/flash_params.h"

namespace dpa::cuda {

// Merges p.partial_o [splits, b, H, max_sq, dv] and p.partial_lse [splits, b, H, max_sq] into
// p.o (dtype `dtype`, p's strides) and p.lse, adding the sink of p.softmax_type.
void launch_merge_partials(const FlashForwardParams& p, DType dtype, int head_dim_v,
                           cudaStream_t stream);

}  // namespace dpa::cuda
