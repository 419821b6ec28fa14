// The CP algorithms behind ContextParallelAttention.
#pragma once

#include <vector>

#include "core/backend.h"
#include "cp/calls_in_flight.h"
#include "cp/comm_requests.h"
#include "cp/device_ring.h"
#include "dpa/cp.h"

namespace dpa::cp {

// What a ContextParallelAttention keeps between its calls; either may be null.
struct CallState {
  // The device ring's buffers (cp/device_ring.h); null: buffers of the call's own.
  RingWorkspace* workspace = nullptr;
  // Device-resident calls hand their transfers to it and return once their work is enqueued
  // (cp/calls_in_flight.h); null: they return with the caller's stream synchronised.
  CallsInFlight* in_flight = nullptr;
};

// `tile_backends`: what the tiles choose from (the registry; a test injects wrapped backends to
// prove that its checks catch a broken tile, or to count tiles). The device ring, which runs
// its own kernels, is taken only with the registry.
ForwardResult forward(const AttentionConfig& config, const CpConfig& cp, Communicator& comm,
                      const ForwardArgs& args, double dropout, const RngState& rng,
                      const CallState& state = {},
                      const std::vector<const Backend*>& tile_backends = registered_backends());
BackendKind backward(const AttentionConfig& config, const CpConfig& cp, Communicator& comm,
                     const BackwardArgs& args, double dropout, const CallState& state = {},
                     const std::vector<const Backend*>& tile_backends = registered_backends());

}  // namespace dpa::cp
