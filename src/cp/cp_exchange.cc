#include "cp/cp_exchange.h"

#include <algorithm>
#include <utility>

#include "cp/comm_requests.h"
#include "cp/device_sets.h"

namespace dpa::cp {

void order_for_comm(Communicator& comm, const Packed& set) {
  if (!set.place.on_device()) return;
  if (DeviceCommunicator* device_comm = comm.device_communicator())
    order_after_device(device_comm->stream(), set.place);
}

GroupExchange start_group_all_to_all(Communicator& comm, const Plan& plan, Packed send) {
  GroupExchange exchange;
  if (plan.a2a == 1) {
    exchange.recv = std::move(send);
    return exchange;
  }
  exchange.recv = Packed::alike(send, send.dtype, send.rows, send.heads, send.dim);
  exchange.send = std::move(send);
  const Packed& out = exchange.send;
  const size_t block = out.size_bytes() / size_t(plan.a2a);
  // After the receive buffer's allocation and the writes of `send` on the set's stream.
  order_for_comm(comm, out);
  const auto* src = static_cast<const unsigned char*>(out.data());
  auto* dst = static_cast<unsigned char*>(exchange.recv.data());
  // Every rank posts its sends and receives in member order: the per-pair order matches.
  for (int d = 0; d < plan.a2a; ++d) {
    if (d == plan.member) {
      copy_bytes(dst + size_t(d) * block, src + size_t(d) * block, block, out.place);
      continue;
    }
    const int peer = plan.group_ranks[size_t(d)];
    exchange.pending.push_back(comm.send(src + size_t(d) * block, block, peer, kTagA2A));
    exchange.pending.push_back(comm.recv(dst + size_t(d) * block, block, peer, kTagA2A));
  }
  return exchange;
}

void GroupExchange::finish(Transfers& transfers) {
  transfers.settle(pending);
  send = Packed();
}

Packed group_all_to_all(Communicator& comm, const Plan& plan, Packed send, Transfers& transfers) {
  GroupExchange exchange = start_group_all_to_all(comm, plan, std::move(send));
  start_pending(comm);
  exchange.finish(transfers);
  return std::move(exchange.recv);
}

void exchange_output_block(Communicator& comm, const Plan& plan, const Packed& send, int round,
                           OutputExchange& exchange, int tag, int ring_offset) {
  const size_t block = send.size_bytes() / size_t(plan.a2a);
  const auto* src = static_cast<const unsigned char*>(send.data());
  auto* dst = static_cast<unsigned char*>(exchange.recv.data());
  const int n = plan.ring_size(), offset = ring_offset % n;
  if (round == 0 && offset == 0) {
    copy_bytes(dst + size_t(plan.member) * block, src + size_t(plan.member) * block, block,
               send.place);
    return;
  }
  const int to = (plan.member + round) % plan.a2a;
  const int from = (plan.member - round + plan.a2a) % plan.a2a;
  const int to_group = (plan.group + offset) % n, from_group = (plan.group - offset + n) % n;
  // After the block's rows were written (and the receive buffer allocated) on the set's stream.
  order_for_comm(comm, send);
  exchange.pending.push_back(
      comm.send(src + size_t(to) * block, block, plan.rank_of(to_group, to), tag));
  exchange.pending.push_back(
      comm.recv(dst + size_t(from) * block, block, plan.rank_of(from_group, from), tag));
}

// Sequence shards -> head shards: [2T, H, d] -> [a * 2T, H / a, d] (the group's chunks).
GroupExchange start_to_heads(Communicator& comm, const Plan& plan, Packed local) {
  if (plan.a2a == 1) return start_group_all_to_all(comm, plan, std::move(local));
  return start_group_all_to_all(comm, plan, split_heads(local, plan.a2a));
}

// Head shards -> sequence shards: the inverse of start_to_heads.
Packed to_sequence(Communicator& comm, const Plan& plan, Packed heads, Transfers& transfers) {
  if (plan.a2a == 1) return heads;
  return merge_heads(group_all_to_all(comm, plan, std::move(heads), transfers), plan.a2a);
}

void start_pending(Communicator& comm) {
  if (DeviceCommunicator* device_comm = comm.device_communicator()) device_comm->start_pending();
}

Packed zeros_f32(int64_t rows, int64_t heads, int64_t dim, const Placement& where) {
  Packed p(DType::kFloat32, rows, heads, dim, where);
  fill(p, 0.0f);
  return p;
}

// One step of a ring: sends `k`, `v` to the next rank, receives the previous rank's into
// `next_k`, `next_v`; the caller computes meanwhile and settles the handles
// (Transfers).
std::vector<CommHandle> ring_exchange(Communicator& comm, const Plan& plan, const Packed& a,
                                      const Packed& b, Packed& next_a, Packed& next_b, int tag_a,
                                      int tag_b) {
  const int n = plan.ring_size(), pos = plan.group;
  const int next = plan.ring_ranks[size_t((pos + 1) % n)];
  const int prev = plan.ring_ranks[size_t((pos - 1 + n) % n)];
  // Device sets: the communicator's stream first waits for the work queued so far, which wrote
  // a and b and may still read next_a and next_b (the step before last's sets).
  order_for_comm(comm, a);
  std::vector<CommHandle> handles;
  handles.push_back(comm.send(a.data(), a.size_bytes(), next, tag_a));
  handles.push_back(comm.send(b.data(), b.size_bytes(), next, tag_b));
  handles.push_back(comm.recv(next_a.data(), next_a.size_bytes(), prev, tag_a));
  handles.push_back(comm.recv(next_b.data(), next_b.size_bytes(), prev, tag_b));
  start_pending(comm);
  return handles;
}

}  // namespace dpa::cp
