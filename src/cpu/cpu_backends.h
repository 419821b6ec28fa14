// The two host backends (DESIGN.md §1): the fp64 oracle and the fast tiled one.
#pragma once

#include <optional>
#include <string>

#include "core/backend.h"

namespace dpa {

// fp64, plain loops, written to be read: the oracle for every other backend.
const Backend& cpu_exact_backend();

// Tiled online-softmax forward and FA2-style backward (P recomputed from LSE), fp32
// accumulation, multithreaded. The default for host tensors.
const Backend& cpu_tiled_backend();

// Both write a CP tile's bias gradient into the unsharded dbias, never tile-local.
inline std::optional<std::string> refuse_tile_local_dbias(const FeatureRequest& request) {
  if (request.cp.dbias_local)
    return "a tile-local bias gradient of a context-parallel tile (the host backends add into "
           "the unsharded dbias)";
  return std::nullopt;
}

}  // namespace dpa
