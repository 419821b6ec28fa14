// Data movement of the CP algorithms: the a2a group's all-to-all (sequence <-> heads), one
// ring step, and the message tags that keep successive steps apart.
#pragma once

#include <vector>

#include "cp/comm_requests.h"
#include "cp/cp_layout.h"
#include "cp/cp_setup.h"

namespace dpa::cp {

// Message tags: FIFO order per (source, destination, tag) keeps successive steps apart.
constexpr int kTagA2A = 1, kTagA2AOutput = 2, kTagA2ADq = 3, kTagA2ADk = 4, kTagA2ADv = 5,
              kTagK = 10, kTagV = 11, kTagDk = 20, kTagDv = 21;
constexpr int kTagGatherK = 30, kTagGatherV = 31, kTagGatherDk = 40, kTagGatherDv = 41;

// A group all-to-all in flight: [a][rows][h][d] blocks, block d of `send` to group member d,
// block s of `recv` from member s. The member's own block is in `recv` at once (a local copy);
// the others once the transfers are settled. `send` stays alive until then: the peers read it.
struct GroupExchange {
  Packed send, recv;
  std::vector<CommHandle> pending;
  // Settles every transfer and releases `send`; `recv` is then complete for the sets' stream.
  void finish(Transfers& transfers);
};
GroupExchange start_group_all_to_all(Communicator& comm, const Plan& plan, Packed send);
Packed group_all_to_all(Communicator& comm, const Plan& plan, Packed send, Transfers& transfers);
// Sequence shards -> head shards, posted: the rank's own rows of the group's heads can be used
// while the peers' are in flight. Without a2a the set passes through (moved, not copied).
GroupExchange start_to_heads(Communicator& comm, const Plan& plan, Packed local);
Packed to_sequence(Communicator& comm, const Plan& plan, Packed heads, Transfers& transfers);
// The outputs' group all-to-all (head shards back to sequence shards), posted block by block as
// their rows become final: round t (1 .. a - 1) sends block member + t (mod a) of `send` to that
// member and receives block member - t from that member into `recv`; round 0 copies the
// member's own block. Every member's round t pairs the same ranks, so a device communicator's
// grouped launches match round by round however far apart the members post them. `recv` is
// complete once every round ran and `pending` was settled; `send` must live until then.
// `tag`: kTagA2AOutput (the forward's o and LSE), kTagA2ADq, kTagA2ADk, kTagA2ADv (the
// backward's dq, dk, dv). `ring_offset`: the blocks' owners are in the group that many ring
// positions ahead (the members of the same place), and the received blocks come from the group
// as far behind; round 0 is then a transfer too (a2a+p2p's dk and dv of the ring's last step).
struct OutputExchange {
  Packed recv;
  std::vector<CommHandle> pending;
};
void exchange_output_block(Communicator& comm, const Plan& plan, const Packed& send, int round,
                           OutputExchange& exchange, int tag = kTagA2AOutput, int ring_offset = 0);

// Launches what a device communicator queued (NCCL: one group of point-to-point operations),
// so that it runs while the caller computes.
void start_pending(Communicator& comm);
Packed zeros_f32(int64_t rows, int64_t heads, int64_t dim, const Placement& where = {});

// Before a device set is sent or received into over a device communicator, the communicator's
// stream waits for the work queued on the set's stream so far (which wrote it, or still reads
// the buffer a receive overwrites). Host sets need nothing.
void order_for_comm(Communicator& comm, const Packed& set);

// One step of a ring: sends `a`, `b` to the next rank, receives the previous rank's into
// `next_a`, `next_b`; the caller computes meanwhile and settles the handles
// (Transfers).
std::vector<CommHandle> ring_exchange(Communicator& comm, const Plan& plan, const Packed& a,
                                      const Packed& b, Packed& next_a, Packed& next_b, int tag_a,
                                      int tag_b);

}  // namespace dpa::cp
