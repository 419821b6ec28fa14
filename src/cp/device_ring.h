// The device-resident p2p ring (docs/context_parallel.md "The device ring"): context
// parallelism over a DeviceCommunicator with every buffer in GPU memory. KV (and dKV in the
// backward) travel the ring through the communicator (NCCL across GPUs) while the tiles of the
// current step run on the caller's stream, so the transfer hides behind the compute. Each tile is a
// plain DotProductAttention call on row ranges of the local shard (no CP fields: with the
// dual-chunk split and a causal mask, every step is one of three shapes), and its partial joins
// fp32 accumulators on the GPU (cuda/cp_ring_ops.h).
//
// It covers the common training case. Every other call with CUDA tensors under a
// DeviceCommunicator takes the general algorithms with their chunk sets on the device
// (cp_attention.cc); see device_ring_refusal.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dpa/cp.h"

namespace dpa::cp {

class CallsInFlight;  // cp/calls_in_flight.h

// The ring's schedule (host logic, tested in tests/cp/test_cp_device_ring.cc). At step i rank
// `rank` holds the KV of rank source(i) = rank - i (mod size) and the fp32 dKV of that KV; both
// go to rank + 1 after the step, so after `size` hops each dKV is back with its owner.
struct Ring {
  int rank = 0, size = 1;
  int next() const { return (rank + 1) % size; }
  int previous() const { return (rank + size - 1) % size; }
  int source(int step) const { return (rank - step + size) % size; }
};

// The tile of one ring step: query rows [q_first, q_first + q_rows) against key rows
// [kv_first, kv_first + kv_rows) of the local shards (`rows` each), causal (local top-left) or
// not. With the dual-chunk split (rank r holds chunks r and 2n-1-r), KV from rank `source` meets
// the local queries as: source == rank, the local causal triangle (local order is position
// order); source < rank, every query on the first KV chunk; source > rank, the second query
// chunk on every key. Without a causal mask, all on all.
struct StepTile {
  int64_t q_first = 0, q_rows = 0, kv_first = 0, kv_rows = 0;
  bool causal = false;
};
StepTile step_tile(bool causal, int rank, int source, int64_t rows);

// Why the device ring cannot run a call with these settings, or "" when it can: CUDA tensors
// (bshd or sbhd, fp16 or bf16, contiguous q, k, v), comm type p2p, no padding tables, mask
// no_mask or causal, no sliding window, bias, ALiBi, arbitrary mask or dropout. Softcap, every
// softmax type (the sink joins after the merge), GQA and MLA head dims are covered.
std::string device_ring_refusal(const AttentionConfig& config, const CpConfig& cp,
                                const AttentionInputs& in, double dropout);

// The ring's device buffers (KV in flight, fp32 accumulators, tile outputs), kept between
// calls: allocating and freeing ~10 buffers of the shard's size per call costs milliseconds and
// a device synchronisation. Buffers only grow. One per ContextParallelAttention object.
class RingWorkspace;
std::shared_ptr<RingWorkspace> make_ring_workspace();

// Forward and backward over the ring; call only when device_ring_refusal is empty. Given
// `in_flight` (and the workspace, which must then outlive the calls it holds), they return once
// the work is enqueued on the caller's stream, and hand their transfers to it
// (cp/calls_in_flight.h). Without, they return when the outputs are complete (the caller's
// stream is synchronised), and a null workspace uses buffers of the call's own.
ForwardResult device_ring_forward(const AttentionConfig& config, DeviceCommunicator& comm,
                                  const ForwardArgs& args, const RngState& rng,
                                  RingWorkspace* workspace, CallsInFlight* in_flight);
BackendKind device_ring_backward(const AttentionConfig& config, const CpConfig& cp,
                                 DeviceCommunicator& comm, const BackwardArgs& args,
                                 RingWorkspace* workspace, CallsInFlight* in_flight);

}  // namespace dpa::cp
