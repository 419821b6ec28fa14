// Dev-bench tile variants of the flash forward kernel (bf16, head dim 128, 64 or 256).
#pragma once

#include "core/problem.h"

namespace dpa::cuda {

const char* flash_variant_name(int variant);  // nullptr past the last variant
int flash_variant_head_dim(int variant);      // of q, k and v: 128, 64 or 256
void run_flash_variant(int variant, const AttentionProblem& problem);

}  // namespace dpa::cuda
