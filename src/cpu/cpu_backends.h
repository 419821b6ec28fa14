// The two host backends (DESIGN.md §1, issue "core library").
#pragma once

#include "core/backend.h"

namespace dpa {

// fp64, plain loops, written to be read: the oracle for every other backend.
const Backend& cpu_exact_backend();

// Tiled online-softmax forward and FA2-style backward (P recomputed from LSE), fp32
// accumulation, multithreaded. The default for host tensors.
const Backend& cpu_tiled_backend();

}  // namespace dpa
