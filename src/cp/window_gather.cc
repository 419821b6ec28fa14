#include "cp/window_gather.h"

#include <utility>
#include <vector>

#include "cp/comm_requests.h"
#include "cp/cp_exchange.h"
#include "cp/device_sets.h"

namespace dpa::cp {
namespace {

// A rank fetches only the KV chunks its query chunks can see (tile_may_see: windows and causal
// masks), each straight from its owner, instead of the whole KV; the backward sends each fetched
// chunk's dK/dV back to its owner, which adds them up in a fixed order (its own first, then the
// peers by rank). Every rank derives every rank's needs from the same global geometry, so
// senders and receivers agree on what travels, and in which order, without a handshake.

struct ChunkOwner {
  int rank;
  int64_t slot;  // 0 or 1 in the owner's two-slot set (rank_chunks order)
};

ChunkOwner owner_of(int cp, int chunk) {
  return chunk < cp ? ChunkOwner{chunk, 0} : ChunkOwner{2 * cp - 1 - chunk, 1};
}

// The KV chunks rank `reader` needs, ascending.
std::vector<int> chunks_needed(const TileContext& ctx, int cp, int reader) {
  std::vector<int> needed;
  const std::vector<int> q_chunks = rank_chunks(cp, reader);
  for (int c = 0; c < 2 * cp; ++c)
    for (int q_chunk : q_chunks)
      if (tile_may_see(ctx, q_chunk, c)) {
        needed.push_back(c);
        break;
      }
  return needed;
}

unsigned char* slot_bytes(Packed& set, int64_t slot, int64_t rows) {
  return static_cast<unsigned char*>(set.data()) + size_t(slot * rows) * set.row_bytes();
}
const unsigned char* slot_bytes(const Packed& set, int64_t slot, int64_t rows) {
  return static_cast<const unsigned char*>(set.data()) + size_t(slot * rows) * set.row_bytes();
}

void copy_slot(Packed& dst, int64_t dst_slot, const Packed& src, int64_t src_slot, int64_t rows) {
  const size_t bytes = size_t(rows) * src.row_bytes();
  copy_bytes(slot_bytes(dst, dst_slot, rows), slot_bytes(src, src_slot, rows), bytes, src.place);
}

}  // namespace

bool p2p_takes_window_gather(const Plan& plan, const TileContext& ctx) {
  if (plan.all_gather || plan.a2a != 1 || plan.cp < 2) return false;
  const int ring_peer_chunks = 2 * plan.cp - 2;  // what the ring brings every rank
  for (int reader = 0; reader < plan.cp; ++reader) {
    int peer_chunks = 0;
    for (int chunk : chunks_needed(ctx, plan.cp, reader))
      peer_chunks += owner_of(plan.cp, chunk).rank != reader;
    if (peer_chunks > 4 || peer_chunks >= ring_peer_chunks) return false;
  }
  return true;
}

void take_window_gather(Plan& plan) {
  plan.all_gather = true;
  plan.ring_ranks = {plan.rank};
}

GatheredKv gather_needed(Communicator& comm, const Plan& plan, const TileContext& ctx,
                         const Packed& k, const Packed& v) {
  const int cp = plan.cp, me = plan.rank;
  const int64_t rows = k.rows / 2;  // a rank's set holds its two chunks
  GatheredKv out;
  out.chunks = chunks_needed(ctx, cp, me);
  const int64_t n = int64_t(out.chunks.size());
  out.k = Packed::alike(k, k.dtype, n * rows, k.heads, k.dim);
  out.v = Packed::alike(v, v.dtype, n * rows, v.heads, v.dim);
  const size_t k_bytes = size_t(rows) * k.row_bytes(), v_bytes = size_t(rows) * v.row_bytes();
  order_for_comm(comm, k);
  std::vector<CommHandle> pending;
  for (int peer = 0; peer < cp; ++peer) {  // my chunks each peer needs, ascending, K then V
    if (peer == me) continue;
    for (int c : chunks_needed(ctx, cp, peer)) {
      const ChunkOwner owner = owner_of(cp, c);
      if (owner.rank != me) continue;
      pending.push_back(comm.send(slot_bytes(k, owner.slot, rows), k_bytes, peer, kTagGatherK));
      pending.push_back(comm.send(slot_bytes(v, owner.slot, rows), v_bytes, peer, kTagGatherV));
    }
  }
  for (int64_t i = 0; i < n; ++i) {  // in the same order, from each owner
    const ChunkOwner owner = owner_of(cp, out.chunks[size_t(i)]);
    if (owner.rank == me) {
      copy_slot(out.k, i, k, owner.slot, rows);
      copy_slot(out.v, i, v, owner.slot, rows);
      out.own_slots.push_back(size_t(i));
      continue;
    }
    out.peer_slots.push_back(size_t(i));
    pending.push_back(comm.recv(slot_bytes(out.k, i, rows), k_bytes, owner.rank, kTagGatherK));
    pending.push_back(comm.recv(slot_bytes(out.v, i, rows), v_bytes, owner.rank, kTagGatherV));
  }
  start_pending(comm);
  out.pending = std::move(pending);
  return out;
}

// Returns the fetched chunks' fp32 dK/dV (`dk`, `dv`, slots as in `gathered`) to their owners;
// fills this rank's own two-slot accumulators.
ReturningGradients start_returning_gradients(Communicator& comm, const Plan& plan,
                                             const TileContext& ctx, const GatheredKv& gathered,
                                             const Packed& dk, const Packed& dv) {
  const int cp = plan.cp, me = plan.rank;
  const int64_t rows = ctx.geometry->kv.rows_per_chunk;
  const size_t k_bytes = size_t(rows) * dk.row_bytes(), v_bytes = size_t(rows) * dv.row_bytes();
  ReturningGradients returning;
  order_for_comm(comm, dk);
  for (size_t i = 0; i < gathered.chunks.size(); ++i) {
    const ChunkOwner owner = owner_of(cp, gathered.chunks[i]);
    if (owner.rank == me) continue;  // finish_returning_gradients adds it in place
    returning.pending.push_back(
        comm.send(slot_bytes(dk, int64_t(i), rows), k_bytes, owner.rank, kTagGatherDk));
    returning.pending.push_back(
        comm.send(slot_bytes(dv, int64_t(i), rows), v_bytes, owner.rank, kTagGatherDv));
  }
  for (int peer = 0; peer < cp; ++peer) {
    if (peer == me) continue;
    for (int c : chunks_needed(ctx, cp, peer)) {
      const ChunkOwner owner = owner_of(cp, c);
      if (owner.rank == me)
        returning.incoming.push_back({owner.slot,
                                      Packed::alike(dk, DType::kFloat32, rows, dk.heads, dk.dim),
                                      Packed::alike(dv, DType::kFloat32, rows, dv.heads, dv.dim)});
    }
  }
  // The receive buffers were just allocated on the compute stream: the communicator's stream
  // waits for that too.
  order_for_comm(comm, dk);
  size_t next = 0;
  for (int peer = 0; peer < cp; ++peer) {
    if (peer == me) continue;
    for (int c : chunks_needed(ctx, cp, peer)) {
      if (owner_of(cp, c).rank != me) continue;
      ReturningGradients::Incoming& in = returning.incoming[next++];
      returning.pending.push_back(comm.recv(in.dk.data(), k_bytes, peer, kTagGatherDk));
      returning.pending.push_back(comm.recv(in.dv.data(), v_bytes, peer, kTagGatherDv));
    }
  }
  start_pending(comm);
  return returning;
}

void finish_returning_gradients(ReturningGradients& returning, const Plan& plan,
                                const GatheredKv& gathered, const Packed& dk, const Packed& dv,
                                Packed& dk_own, Packed& dv_own, Transfers& transfers) {
  const int64_t rows = dk_own.rows / 2;
  for (size_t i = 0; i < gathered.chunks.size(); ++i) {
    const ChunkOwner owner = owner_of(plan.cp, gathered.chunks[i]);
    if (owner.rank != plan.rank) continue;
    accumulate_rows(dk_own, owner.slot * rows, dk, int64_t(i) * rows, rows);
    accumulate_rows(dv_own, owner.slot * rows, dv, int64_t(i) * rows, rows);
  }
  transfers.settle(returning.pending);
  for (const ReturningGradients::Incoming& in : returning.incoming) {
    accumulate_rows(dk_own, in.slot * rows, in.dk, 0, rows);
    accumulate_rows(dv_own, in.slot * rows, in.dv, 0, rows);
  }
}

}  // namespace dpa::cp
