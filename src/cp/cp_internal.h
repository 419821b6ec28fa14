// The CP algorithms behind ContextParallelAttention.
#pragma once

#include <vector>

#include "core/backend.h"
#include "cp/comm_requests.h"
#include "cp/device_ring.h"
#include "dpa/cp.h"

namespace dpa::cp {

// `workspace`: the device ring's buffers kept between calls (cp/device_ring.h), or null.
// `tile_backends`: what the tiles choose from (the registry; a test injects wrapped backends to
// prove that its checks catch a broken tile, or to count tiles). The device ring, which runs
// its own kernels, is taken only with the registry.
ForwardResult forward(const AttentionConfig& config, const CpConfig& cp, Communicator& comm,
                      const ForwardArgs& args, double dropout, const RngState& rng,
                      RingWorkspace* workspace = nullptr,
                      const std::vector<const Backend*>& tile_backends = registered_backends());
BackendKind backward(const AttentionConfig& config, const CpConfig& cp, Communicator& comm,
                     const BackwardArgs& args, double dropout, RingWorkspace* workspace = nullptr,
                     const std::vector<const Backend*>& tile_backends = registered_backends());

}  // namespace dpa::cp
