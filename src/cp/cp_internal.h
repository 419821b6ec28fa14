// The CP algorithms behind ContextParallelAttention, with test-only switches.
#pragma once

#include <vector>

#include "cp/comm_requests.h"
#include "cp/device_ring.h"
#include "dpa/cp.h"

namespace dpa::cp {

struct DebugOptions {
  // The classic bug, kept to prove the tests catch it: every tile counts the sink (and no sink
  // is added after the merge).
  bool sink_per_tile = false;
};

// `workspace`: the device ring's buffers kept between calls (cp/device_ring.h), or null.
ForwardResult forward(const AttentionConfig& config, const CpConfig& cp, Communicator& comm,
                      const ForwardArgs& args, double dropout, const RngState& rng,
                      const DebugOptions& debug = {}, RingWorkspace* workspace = nullptr);
BackendKind backward(const AttentionConfig& config, const CpConfig& cp, Communicator& comm,
                     const BackwardArgs& args, double dropout, RingWorkspace* workspace = nullptr);

}  // namespace dpa::cp
