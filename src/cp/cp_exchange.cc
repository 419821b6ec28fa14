#include "cp/cp_exchange.h"

#include <algorithm>

#include "cp/device_sets.h"

namespace dpa::cp {

void order_for_comm(Communicator& comm, const Packed& set) {
  if (!set.place.on_device()) return;
  if (DeviceCommunicator* device_comm = comm.device_communicator())
    order_after_device(device_comm->stream(), set.place);
}

// [a][rows][h][d] blocks: block d goes to group member d; block s comes from member s.
Packed group_all_to_all(Communicator& comm, const Plan& plan, const Packed& send) {
  if (plan.a2a == 1) return send;
  Packed recv = Packed::alike(send, send.dtype, send.rows, send.heads, send.dim);
  const size_t block = send.size_bytes() / size_t(plan.a2a);
  order_for_comm(comm, send);
  if (plan.a2a == comm.size()) {
    comm.all_to_all(send.data(), recv.data(), block)->wait();
    return recv;
  }
  const auto* src = static_cast<const unsigned char*>(send.data());
  auto* dst = static_cast<unsigned char*>(recv.data());
  std::vector<CommHandle> pending;
  for (int d = 0; d < plan.a2a; ++d) {
    if (d == plan.member) {
      copy_bytes(dst + size_t(d) * block, src + size_t(d) * block, block, send.place);
      continue;
    }
    pending.push_back(
        comm.send(src + size_t(d) * block, block, plan.group_ranks[size_t(d)], kTagA2A));
    pending.push_back(
        comm.recv(dst + size_t(d) * block, block, plan.group_ranks[size_t(d)], kTagA2A));
  }
  for (CommHandle& handle : pending) handle->wait();
  return recv;
}

// Sequence shards -> head shards: [2T, H, d] -> [a * 2T, H / a, d] (the group's chunks).
Packed to_heads(Communicator& comm, const Plan& plan, Packed local) {
  if (plan.a2a == 1) return local;
  return group_all_to_all(comm, plan, split_heads(local, plan.a2a));
}

// Head shards -> sequence shards: the inverse of to_heads.
Packed to_sequence(Communicator& comm, const Plan& plan, Packed heads) {
  if (plan.a2a == 1) return heads;
  return merge_heads(group_all_to_all(comm, plan, heads), plan.a2a);
}

Packed zeros_f32(int64_t rows, int64_t heads, int64_t dim, const Placement& where) {
  Packed p(DType::kFloat32, rows, heads, dim, where);
  fill(p, 0.0f);
  return p;
}

// One step of a ring: sends `k`, `v` to the next rank, receives the previous rank's into
// `next_k`, `next_v`; the caller computes meanwhile and waits on the handles.
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
  if (DeviceCommunicator* device_comm = comm.device_communicator()) device_comm->start_pending();
  return handles;
}

}  // namespace dpa::cp
