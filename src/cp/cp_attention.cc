// The four CP comm types (DESIGN.md §8) over a Communicator, forward and backward.
//
// Every comm type is the same computation arranged differently. Each rank ends up with a query
// chunk set (its own 2 chunks, or under a2a its group's 2a chunks for a slice of the heads)
// and meets key chunk sets one after another (a ring), or all at once (all_gather). For each
// (query chunk, key chunk) pair that the window leaves visible it runs a tile (tile.h) and
// merges the sink-free partials in fp32: LSE = logaddexp(LSE_a, LSE_b),
// o = o_a exp(LSE_a - LSE) + o_b exp(LSE_b - LSE). The sink joins once per row after the
// merge: LSE' = logaddexp(LSE, sigma), o' = o exp(LSE - LSE'). The backward tiles use the final
// o and LSE; dalpha is computed once per row here, from the final LSE.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "core/call_rng.h"
#include "core/element_access.h"
#include "core/environment.h"
#include "core/problem_builder.h"
#include "cp/cp_internal.h"
#include "cp/cp_layout.h"
#include "cp/device_ring.h"
#include "cp/tile.h"

#if defined(DPA_WITH_CUDA)
#include "cuda/runtime.h"
#endif

namespace dpa::cp {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Message tags: FIFO order per (source, destination, tag) keeps successive steps apart.
constexpr int kTagA2A = 1, kTagK = 10, kTagV = 11, kTagDk = 20, kTagDv = 21;
constexpr int kTagGatherK = 30, kTagGatherV = 31, kTagGatherDk = 40, kTagGatherDv = 41;

std::string str(int64_t value) { return std::to_string(value); }

// ---- Validation and geometry ----

std::vector<int64_t> read_host_int32(const TensorView& t, const char* name) {
  require(t.ndim == 1 && t.dtype == DType::kInt32, name, "must be a 1-D int32 tensor [b + 1]");
  require(t.device == Device::kCPU, name, "must be a host tensor for the CPU CP path");
  std::vector<int64_t> values(size_t(t.shape[0]));
  for (int64_t i = 0; i < t.shape[0]; ++i)
    values[size_t(i)] = static_cast<const int32_t*>(t.data)[i * t.strides[0]];
  return values;
}

SideGeometry side_geometry(Format format, int cp, const TensorView& local, const TensorView& cu,
                           const TensorView& cu_padded, int64_t batch, const char* name,
                           const char* cu_name, const char* padded_name) {
  SideGeometry side;
  if (format == Format::kTHD) {
    require(cu.ndim > 0, cu_name, "is required with format thd");
    std::vector<int64_t> cu_values = read_host_int32(cu, cu_name);
    std::vector<int64_t> padded =
        cu_padded.ndim > 0 ? read_host_int32(cu_padded, padded_name) : cu_values;
    require(int64_t(cu_values.size()) == batch + 1 && padded.size() == cu_values.size(),
            padded_name, "must have b + 1 entries like " + std::string(cu_name));
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t slot = padded[size_t(b + 1)] - padded[size_t(b)];
      const int64_t length = cu_values[size_t(b + 1)] - cu_values[size_t(b)];
      require(slot % (2 * cp) == 0 && slot >= length && length >= 0, padded_name,
              "slot " + str(b) + " (" + str(slot) + " rows) must hold the sequence (" +
                  str(length) + ") and be a multiple of 2 * cp = " + str(2 * cp) +
                  " (see thd_cp_partition)");
      side.length.push_back(length);
      side.chunk.push_back(slot / (2 * cp));
      side.local_start.push_back(padded[size_t(b)] / cp);
    }
    require(local.shape[0] == padded.back() / cp, name,
            "must hold cu_seqlens_padded[b] / cp = " + str(padded.back() / cp) + " rows, got " +
                str(local.shape[0]));
  } else {
    const int64_t local_seq = local.shape[format == Format::kBSHD ? 1 : 0];
    require(local_seq % 2 == 0, name,
            "local sequence length must be even (two chunks per rank), got " + str(local_seq));
    const int64_t full = local_seq * cp;
    std::vector<int64_t> lengths(size_t(batch), full);
    if (cu.ndim > 0) {
      std::vector<int64_t> cu_values = read_host_int32(cu, cu_name);
      require(int64_t(cu_values.size()) == batch + 1, cu_name, "must have b + 1 entries");
      for (int64_t b = 0; b < batch; ++b) {
        lengths[size_t(b)] = cu_values[size_t(b + 1)] - cu_values[size_t(b)];
        require(lengths[size_t(b)] >= 0 && lengths[size_t(b)] <= full, cu_name,
                "gives a length outside [0, " + str(full) + "]");
      }
    }
    side.length = lengths;
    side.chunk.assign(size_t(batch), local_seq / 2);
    side.local_start.assign(size_t(batch), 0);
  }
  int64_t prefix = 0;
  for (int64_t c : side.chunk) {
    side.prefix.push_back(prefix);
    prefix += c;
  }
  side.rows_per_chunk = prefix;
  return side;
}

struct Plan {
  int cp = 1, rank = 0;
  int a2a = 1;  // head-sharding group size
  int group = 0, member = 0;
  bool all_gather = false;
  std::vector<int> group_ranks, ring_ranks;
  int64_t heads_q = 0, heads_kv = 0;  // unsharded H, G
  int64_t kv_replication = 1;         // G' / G when KV heads are replicated for a2a

  int ring_size() const { return int(ring_ranks.size()); }
  int64_t local_heads() const { return heads_q / a2a; }
  // The chunks held by a2a group `g`, in the order the group all-to-all stacks them.
  std::vector<int> group_chunks(int g) const {
    std::vector<int> chunks;
    for (int d = 0; d < a2a; ++d)
      for (int c : rank_chunks(cp, g * a2a + d)) chunks.push_back(c);
    return chunks;
  }
};

Plan make_plan(const CpConfig& config, const Communicator& comm, int64_t heads_q,
               int64_t heads_kv) {
  Plan plan;
  plan.cp = comm.size();
  plan.rank = comm.rank();
  plan.heads_q = heads_q;
  plan.heads_kv = heads_kv;
  switch (config.comm_type) {
    case CpCommType::kP2P:
      plan.a2a = 1;
      break;
    case CpCommType::kAllGather:
      plan.a2a = 1;
      plan.all_gather = true;
      break;
    case CpCommType::kA2A:
      plan.a2a = plan.cp;
      break;
    case CpCommType::kA2AP2P:
      require(config.a2a_group_size >= 1 && plan.cp % config.a2a_group_size == 0, "a2a_group_size",
              "must divide the CP size " + str(plan.cp) + ", got " + str(config.a2a_group_size));
      plan.a2a = config.a2a_group_size;
      break;
  }
  require(heads_q % plan.a2a == 0, "q",
          "head count H = " + str(heads_q) + " must be a multiple of the a2a group size " +
              str(plan.a2a) + " (heads are sharded)");
  // KV heads: when G does not split over the group, replicate them to the fewest G' (a
  // multiple of G dividing H) that does, instead of refusing (DESIGN.md §8).
  int64_t replicated = heads_kv;
  while (replicated % plan.a2a != 0 || heads_q % replicated != 0) replicated += heads_kv;
  plan.kv_replication = replicated / heads_kv;
  plan.group = plan.rank / plan.a2a;
  plan.member = plan.rank % plan.a2a;
  for (int d = 0; d < plan.a2a; ++d) plan.group_ranks.push_back(plan.group * plan.a2a + d);
  if (plan.all_gather)
    plan.ring_ranks = {plan.rank};
  else
    for (int g = 0; g < plan.cp / plan.a2a; ++g)
      plan.ring_ranks.push_back(g * plan.a2a + plan.member);
  return plan;
}

void require_like(const TensorView& t, const TensorView& like, int64_t dim, const char* name) {
  require(t.ndim == like.ndim && t.dtype == like.dtype && t.device == Device::kCPU, name,
          "must be a host tensor like the local q shard");
  for (int d = 0; d + 1 < like.ndim; ++d)
    require(t.shape[d] == like.shape[d], name, "must have the local shard's shape");
  require(t.shape[t.ndim - 1] == dim && t.strides[t.ndim - 1] == 1, name,
          "must have a contiguous last dim of " + str(dim));
}

struct Setup {
  Geometry geometry;
  Plan plan;
};

// Rows of the unsharded sequences along one side: the padded length (bshd / sbhd) or the
// longest sequence (thd), as the non-CP problem's max_seqlen.
int64_t unsharded_rows(const Geometry& g, const SideGeometry& side) {
  int64_t rows = 0;
  for (size_t b = 0; b < side.length.size(); ++b)
    rows = std::max(rows, g.format == Format::kTHD ? side.length[b] : side.chunk[b] * 2 * g.cp);
  return rows;
}

// A [b|1, H|1, Sq|1, Skv] host tensor of the unsharded sequences (bias, attn_mask, dbias).
void require_unsharded(const TensorView& t, const char* name, const Geometry& g, int64_t heads,
                       bool row_broadcast) {
  const int64_t sq = unsharded_rows(g, g.q), skv = unsharded_rows(g, g.kv);
  std::string expected = "[";  // appended piecewise: GCC 12 misreports a + chain (-Wrestrict)
  expected += str(g.batch);
  expected += "|1, ";
  expected += str(heads);
  expected += "|1, ";
  expected += str(sq);
  expected += row_broadcast ? "|1, " : ", ";
  expected += str(skv);
  expected += "]";
  require(t.ndim == 4 && t.device == Device::kCPU, name,
          "must be a host tensor " + expected +
              " of the unsharded sequences (every rank passes the whole tensor)");
  require((t.shape[0] == g.batch || t.shape[0] == 1) && (t.shape[1] == heads || t.shape[1] == 1) &&
              (t.shape[2] == sq || (row_broadcast && t.shape[2] == 1)) && t.shape[3] == skv,
          name, "must have the unsharded shape " + expected + ", got " + t.shape_string());
}

Setup setup(const AttentionConfig& config, const CpConfig& cp, const Communicator& comm,
            const AttentionInputs& in) {
  validate_config(config);
  require(comm.size() >= 1 && comm.rank() >= 0 && comm.rank() < comm.size(), "communicator",
          "has an invalid rank/size");
  const int expected_ndim = config.format == Format::kTHD ? 3 : 4;
  for (const auto& [t, name] : {std::pair{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}}) {
    require(t->ndim == expected_ndim && t->device == Device::kCPU, name,
            "must be a host tensor with " + str(expected_ndim) + " dims");
    require(t->strides[t->ndim - 1] == 1, name, "must have a contiguous head dim");
    require(t->dtype == in.q.dtype && is_floating(t->dtype), name, "must share q's floating dtype");
  }
  const int hd = expected_ndim - 2;
  const int64_t heads_q = in.q.shape[hd], heads_kv = in.k.shape[hd];
  require(heads_kv > 0 && heads_q % heads_kv == 0 && in.v.shape[hd] == heads_kv, "k",
          "KV heads must divide the query heads (and match v)");
  require(in.k.shape[hd + 1] == in.q.shape[hd + 1], "k", "must have q's head dim");
  if (config.format != Format::kTHD) {
    const int batch_dim = config.format == Format::kBSHD ? 0 : 1;
    require(in.k.shape[batch_dim] == in.q.shape[batch_dim], "k", "batch differs from q's");
  }
  if (config.softmax_type == SoftmaxType::kLearnable) {
    const TensorView& s = in.softmax_offset;
    require(s.ndim == 1 && s.shape[0] == heads_q && s.dtype == DType::kFloat32 &&
                s.is_contiguous() && s.device == Device::kCPU,
            "softmax_offset", "must be a host fp32 [H] tensor (the full, unsharded offsets)");
  }
  if (in.alibi_slopes.ndim > 0)
    require(in.alibi_slopes.is_contiguous() && in.alibi_slopes.dtype == DType::kFloat32,
            "alibi_slopes", "must be contiguous fp32");

  Setup s;
  Geometry& g = s.geometry;
  g.format = config.format;
  g.cp = comm.size();
  g.batch = config.format == Format::kTHD ? in.cu_seqlens_q.shape[0] - 1
                                          : in.q.shape[config.format == Format::kBSHD ? 0 : 1];
  require(config.format != Format::kTHD || in.cu_seqlens_q.ndim == 1, "cu_seqlens_q",
          "is required with format thd");
  g.q = side_geometry(config.format, g.cp, in.q, in.cu_seqlens_q, in.cu_seqlens_q_padded, g.batch,
                      "q", "cu_seqlens_q", "cu_seqlens_q_padded");
  g.kv = side_geometry(config.format, g.cp, in.k, in.cu_seqlens_kv, in.cu_seqlens_kv_padded,
                       g.batch, "k", "cu_seqlens_kv", "cu_seqlens_kv_padded");
  require(in.v.shape[0] == in.k.shape[0] && in.v.shape[1] == in.k.shape[1], "v",
          "must have k's rows");
  const bool bottom_right = mask_bottom_right(config.mask_type, config.bottom_right_diagonal);
  for (int64_t b = 0; b < g.batch; ++b)
    g.diagonal.push_back(bottom_right ? g.kv.length[size_t(b)] - g.q.length[size_t(b)] : 0);
  g.window_left = config.window_left;
  g.window_right = mask_is_causal(config.mask_type) ? 0 : config.window_right;
  s.plan = make_plan(cp, comm, heads_q, heads_kv);

  // Bias and arbitrary mask: every rank passes the unsharded tensor; tiles read it at their
  // global positions.
  if (config.bias_type == BiasType::kNoBias) {
    require(in.bias.ndim == 0, "bias", "is given but bias_type is no_bias");
  } else {
    require(in.bias.ndim > 0, "bias",
            "is required with bias_type " + std::string(to_string(config.bias_type)));
    require(is_floating(in.bias.dtype), "bias", "must be a floating-point tensor");
    require_unsharded(in.bias, "bias", g, heads_q, true);
  }
  if (config.mask_type == MaskType::kArbitrary) {
    require(in.attn_mask.ndim > 0 && in.attn_mask.dtype == DType::kBool, "attn_mask",
            "must be a bool tensor with mask_type arbitrary");
    require_unsharded(in.attn_mask, "attn_mask", g, heads_q, false);
  } else {
    require(in.attn_mask.ndim == 0, "attn_mask", "is only used with mask_type arbitrary");
  }
  return s;
}

// ---- Data movement ----

// [a][rows][h][d] blocks: block d goes to group member d; block s comes from member s.
Packed group_all_to_all(Communicator& comm, const Plan& plan, const Packed& send) {
  if (plan.a2a == 1) return send;
  Packed recv(send.dtype, send.rows, send.heads, send.dim);
  const size_t block = send.bytes.size() / size_t(plan.a2a);
  if (plan.a2a == comm.size()) {
    comm.all_to_all(send.data(), recv.data(), block)->wait();
    return recv;
  }
  const auto* src = static_cast<const unsigned char*>(send.data());
  auto* dst = static_cast<unsigned char*>(recv.data());
  std::vector<CommHandle> pending;
  for (int d = 0; d < plan.a2a; ++d) {
    if (d == plan.member) {
      std::memcpy(dst + size_t(d) * block, src + size_t(d) * block, block);
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
Packed to_heads(Communicator& comm, const Plan& plan, const Packed& local) {
  if (plan.a2a == 1) return local;
  return group_all_to_all(comm, plan, split_heads(local, plan.a2a));
}

// Head shards -> sequence shards: the inverse of to_heads.
Packed to_sequence(Communicator& comm, const Plan& plan, const Packed& heads) {
  if (plan.a2a == 1) return heads;
  return merge_heads(group_all_to_all(comm, plan, heads), plan.a2a);
}

Packed zeros_f32(int64_t rows, int64_t heads, int64_t dim) {
  Packed p(DType::kFloat32, rows, heads, dim);
  std::fill(p.f32(), p.f32() + p.numel(), 0.0f);
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
  std::vector<CommHandle> handles;
  handles.push_back(comm.send(a.data(), a.bytes.size(), next, tag_a));
  handles.push_back(comm.send(b.data(), b.bytes.size(), next, tag_b));
  handles.push_back(comm.recv(next_a.data(), next_a.bytes.size(), prev, tag_a));
  handles.push_back(comm.recv(next_b.data(), next_b.bytes.size(), prev, tag_b));
  return handles;
}

TileContext tile_context(const AttentionConfig& config, const Setup& s, const AttentionInputs& in,
                         double dropout, const RngState& rng) {
  TileContext ctx;
  ctx.config = config;
  ctx.geometry = &s.geometry;
  ctx.softmax_offset = in.softmax_offset;
  ctx.alibi_slopes = in.alibi_slopes;
  ctx.heads_total = s.plan.heads_q;
  ctx.head_offset = s.plan.member * s.plan.local_heads();
  ctx.bias_type = config.bias_type;
  ctx.bias = in.bias;
  if (config.mask_type == MaskType::kArbitrary) ctx.attn_mask = in.attn_mask;
  ctx.dropout = dropout;
  ctx.rng = rng;
  return ctx;
}

// ---- Window-aware all_gather ----
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

// The chunks this rank needs, K and V each in one set (slot i holds chunks[i]).
struct GatheredKv {
  std::vector<int> chunks;
  Packed k, v;
};

GatheredKv gather_needed(Communicator& comm, const Plan& plan, const TileContext& ctx,
                         const Packed& k, const Packed& v) {
  const int cp = plan.cp, me = plan.rank;
  const int64_t rows = k.rows / 2;  // a rank's set holds its two chunks
  GatheredKv out;
  out.chunks = chunks_needed(ctx, cp, me);
  const int64_t n = int64_t(out.chunks.size());
  out.k = Packed(k.dtype, n * rows, k.heads, k.dim);
  out.v = Packed(v.dtype, n * rows, v.heads, v.dim);
  const size_t k_bytes = size_t(rows) * k.row_bytes(), v_bytes = size_t(rows) * v.row_bytes();
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
      std::memcpy(slot_bytes(out.k, i, rows), slot_bytes(k, owner.slot, rows), k_bytes);
      std::memcpy(slot_bytes(out.v, i, rows), slot_bytes(v, owner.slot, rows), v_bytes);
      continue;
    }
    pending.push_back(comm.recv(slot_bytes(out.k, i, rows), k_bytes, owner.rank, kTagGatherK));
    pending.push_back(comm.recv(slot_bytes(out.v, i, rows), v_bytes, owner.rank, kTagGatherV));
  }
  wait_all(pending);
  return out;
}

// Returns the fetched chunks' fp32 dK/dV (`dk`, `dv`, slots as in `gathered`) to their owners;
// fills this rank's own two-slot accumulators.
void return_gradients(Communicator& comm, const Plan& plan, const TileContext& ctx,
                      const GatheredKv& gathered, Packed& dk, Packed& dv, Packed& dk_own,
                      Packed& dv_own) {
  const int cp = plan.cp, me = plan.rank;
  const int64_t rows = dk_own.rows / 2;
  const size_t k_bytes = size_t(rows) * dk.row_bytes(), v_bytes = size_t(rows) * dv.row_bytes();
  std::vector<CommHandle> pending;
  for (size_t i = 0; i < gathered.chunks.size(); ++i) {
    const ChunkOwner owner = owner_of(cp, gathered.chunks[i]);
    if (owner.rank == me) {
      accumulate_rows(dk_own, owner.slot * rows, dk, int64_t(i) * rows, rows);
      accumulate_rows(dv_own, owner.slot * rows, dv, int64_t(i) * rows, rows);
      continue;
    }
    pending.push_back(
        comm.send(slot_bytes(dk, int64_t(i), rows), k_bytes, owner.rank, kTagGatherDk));
    pending.push_back(
        comm.send(slot_bytes(dv, int64_t(i), rows), v_bytes, owner.rank, kTagGatherDv));
  }
  struct Incoming {
    int64_t slot;
    Packed dk, dv;
  };
  std::vector<Incoming> incoming;
  for (int peer = 0; peer < cp; ++peer) {
    if (peer == me) continue;
    for (int c : chunks_needed(ctx, cp, peer)) {
      const ChunkOwner owner = owner_of(cp, c);
      if (owner.rank == me)
        incoming.push_back({owner.slot, Packed(DType::kFloat32, rows, dk.heads, dk.dim),
                            Packed(DType::kFloat32, rows, dv.heads, dv.dim)});
    }
  }
  size_t next = 0;
  for (int peer = 0; peer < cp; ++peer) {
    if (peer == me) continue;
    for (int c : chunks_needed(ctx, cp, peer)) {
      if (owner_of(cp, c).rank != me) continue;
      Incoming& in = incoming[next++];
      pending.push_back(comm.recv(in.dk.data(), k_bytes, peer, kTagGatherDk));
      pending.push_back(comm.recv(in.dv.data(), v_bytes, peer, kTagGatherDv));
    }
  }
  wait_all(pending);
  for (const Incoming& in : incoming) {  // peers by rank, chunks ascending: a fixed order
    accumulate_rows(dk_own, in.slot * rows, in.dk, 0, rows);
    accumulate_rows(dv_own, in.slot * rows, in.dv, 0, rows);
  }
}

double sink_of(const AttentionConfig& config, const TensorView& offsets, int64_t h) {
  switch (config.softmax_type) {
    case SoftmaxType::kVanilla:
      return -std::numeric_limits<double>::infinity();
    case SoftmaxType::kOffByOne:
      return 0.0;
    case SoftmaxType::kLearnable:
      return static_cast<const float*>(offsets.data)[h];
  }
  return -std::numeric_limits<double>::infinity();
}

// fp32 LSE merge of a tile's partial into the accumulators (rows from `first_row`).
void merge_partial(Packed& o_acc, Packed& lse_acc, int64_t first_row, const TileForwardOut& tile) {
  const int64_t heads = lse_acc.heads, dv = o_acc.dim;
  for (int64_t r = 0; r < tile.lse.rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const float tile_lse = tile.lse.f32()[r * heads + h];
      if (tile_lse == kNegInf) continue;  // no visible key in this tile
      float& lse = lse_acc.f32()[(first_row + r) * heads + h];
      float* o = o_acc.f32() + ((first_row + r) * heads + h) * dv;
      const int64_t tile_base = (r * heads + h) * dv;
      const float merged = lse == kNegInf ? tile_lse
                                          : std::max(lse, tile_lse) +
                                                std::log1p(std::exp(-std::fabs(lse - tile_lse)));
      const float keep = lse == kNegInf ? 0.0f : std::exp(lse - merged);
      const float take = std::exp(tile_lse - merged);
      for (int64_t c = 0; c < dv; ++c)
        o[c] = o[c] * keep + take * float(load_element(tile.o.data(), tile.o.dtype, tile_base + c));
      lse = merged;
    }
}

// The sink joins once per row: LSE' = logaddexp(LSE, sigma), o' = o exp(LSE - LSE').
void add_sink(const AttentionConfig& config, const TensorView& offsets, int64_t head_offset,
              Packed& o_acc, Packed& lse_acc) {
  const int64_t heads = lse_acc.heads, dv = o_acc.dim;
  for (int64_t h = 0; h < heads; ++h) {
    const float sigma = float(sink_of(config, offsets, head_offset + h));
    if (sigma == kNegInf) continue;
    for (int64_t r = 0; r < lse_acc.rows; ++r) {
      float& lse = lse_acc.f32()[r * heads + h];
      if (lse == kNegInf) {
        lse = sigma;  // no visible key: o stays 0
        continue;
      }
      const float merged = std::max(lse, sigma) + std::log1p(std::exp(-std::fabs(lse - sigma)));
      const float scale = std::exp(lse - merged);
      float* o = o_acc.f32() + (r * heads + h) * dv;
      for (int64_t c = 0; c < dv; ++c) o[c] *= scale;
      lse = merged;
    }
  }
}

}  // namespace

// Where the tiles of one CP call run (the CP algorithm itself moves host buffers).
struct TileDevice {
  Device device = Device::kCPU;
  int index = 0;
};

ForwardResult forward_staged(const AttentionConfig& config, const CpConfig& cp_config,
                             Communicator& comm, const ForwardArgs& args, double dropout,
                             const RngState& rng, const DebugOptions& debug, TileDevice tiles) {
  Setup s = setup(config, cp_config, comm, args.in);
  const Geometry& g = s.geometry;
  const Plan& plan = s.plan;
  require_like(args.o, args.in.q, args.in.v.shape[args.in.v.ndim - 1], "o");
  require(args.lse.dtype == DType::kFloat32 && args.lse.device == Device::kCPU, "lse",
          "must be a host fp32 tensor");

  Packed k_local = pack_local(g, g.kv, args.in.k), v_local = pack_local(g, g.kv, args.in.v);
  if (plan.kv_replication > 1) {
    k_local = replicate_heads(k_local, plan.kv_replication);
    v_local = replicate_heads(v_local, plan.kv_replication);
  }
  const Packed q = to_heads(comm, plan, pack_local(g, g.q, args.in.q));
  Packed k = to_heads(comm, plan, k_local), v = to_heads(comm, plan, v_local);

  TileContext ctx = tile_context(config, s, args.in, dropout, rng);
  ctx.sink_per_tile = debug.sink_per_tile;
  ctx.device = tiles.device;
  ctx.device_index = tiles.index;
  const std::vector<int> q_chunks = plan.group_chunks(plan.group);
  Packed o_acc = zeros_f32(q.rows, q.heads, v.dim);
  Packed lse_acc(DType::kFloat32, q.rows, q.heads, 1);
  std::fill(lse_acc.f32(), lse_acc.f32() + lse_acc.numel(), kNegInf);
  BackendKind used = BackendKind::kAuto;

  auto attend = [&](const Packed& keys, const Packed& values, const std::vector<int>& kv_chunks) {
    for (size_t qs = 0; qs < q_chunks.size(); ++qs)
      for (size_t ks = 0; ks < kv_chunks.size(); ++ks) {
        if (!tile_may_see(ctx, q_chunks[qs], kv_chunks[ks])) continue;
        TileForwardOut tile =
            tile_forward(ctx, {&q, int64_t(qs), q_chunks[qs]}, {&keys, int64_t(ks), kv_chunks[ks]},
                         {&values, int64_t(ks), kv_chunks[ks]});
        used = tile.backend;
        merge_partial(o_acc, lse_acc, int64_t(qs) * g.q.rows_per_chunk, tile);
      }
  };

  if (plan.all_gather) {
    const GatheredKv gathered = gather_needed(comm, plan, ctx, k, v);
    attend(gathered.k, gathered.v, gathered.chunks);
  } else {
    const int n = plan.ring_size();
    Packed next_k = k, next_v = v;
    for (int step = 0; step < n; ++step) {
      std::vector<CommHandle> pending;
      if (step + 1 < n) pending = ring_exchange(comm, plan, k, v, next_k, next_v, kTagK, kTagV);
      attend(k, v, plan.group_chunks((plan.group - step + n) % n));
      wait_all(pending);
      if (step + 1 < n) {
        std::swap(k, next_k);
        std::swap(v, next_v);
      }
    }
  }
  if (!debug.sink_per_tile)
    add_sink(config, args.in.softmax_offset, ctx.head_offset, o_acc, lse_acc);

  const Packed o = to_sequence(comm, plan, convert(o_acc, q.dtype));
  const Packed lse = to_sequence(comm, plan, lse_acc);
  unpack_local(g, g.q, o, args.o);
  unpack_lse(g, lse, args.lse);
  if (used == BackendKind::kAuto) used = BackendKind::kCpuExact;  // no visible tile on this rank
  return {used, rng};
}

BackendKind backward_staged(const AttentionConfig& config, const CpConfig& cp_config,
                            Communicator& comm, const BackwardArgs& args, double dropout,
                            TileDevice tiles) {
  Setup s = setup(config, cp_config, comm, args.in);
  const Geometry& g = s.geometry;
  const Plan& plan = s.plan;
  const int64_t dv_dim = args.in.v.shape[args.in.v.ndim - 1];
  const int64_t dqk_dim = args.in.q.shape[args.in.q.ndim - 1];
  require_like(args.o, args.in.q, dv_dim, "o");
  require_like(args.d_o, args.in.q, dv_dim, "d_o");
  require_like(args.dq, args.in.q, dqk_dim, "dq");
  require_like(args.dk, args.in.k, dqk_dim, "dk");
  require_like(args.dv, args.in.v, dv_dim, "dv");
  require(dropout == 0.0 || args.rng.has_value(), "rng",
          "the forward's RNG state is required in backward when dropout > 0");
  const bool wants_dbias = args.dbias.ndim > 0;
  if (wants_dbias) {
    require(config.bias_type != BiasType::kNoBias, "dbias", "is requested but there is no bias");
    require(args.dbias.dtype == args.in.bias.dtype && args.dbias.is_contiguous() &&
                args.dbias.ndim == 4,
            "dbias", "must be a contiguous tensor with bias's dtype");
    for (int d = 0; d < 4; ++d)
      require(args.dbias.shape[d] == args.in.bias.shape[d], "dbias",
              "must have the shape of bias " + args.in.bias.shape_string());
  }
  const bool wants_dalpha = args.dsoftmax_offset.ndim > 0;
  if (wants_dalpha)
    require(config.softmax_type == SoftmaxType::kLearnable &&
                args.dsoftmax_offset.dtype == DType::kFloat32 &&
                args.dsoftmax_offset.numel() == plan.heads_q &&
                args.dsoftmax_offset.is_contiguous(),
            "dsoftmax_offset", "must be a contiguous fp32 [H] tensor (softmax_type learnable)");

  Packed k_local = pack_local(g, g.kv, args.in.k), v_local = pack_local(g, g.kv, args.in.v);
  if (plan.kv_replication > 1) {
    k_local = replicate_heads(k_local, plan.kv_replication);
    v_local = replicate_heads(v_local, plan.kv_replication);
  }
  const Packed q = to_heads(comm, plan, pack_local(g, g.q, args.in.q));
  const Packed o = to_heads(comm, plan, pack_local(g, g.q, args.o));
  const Packed d_o = to_heads(comm, plan, pack_local(g, g.q, args.d_o));
  const Packed lse = to_heads(comm, plan, pack_lse(g, args.lse, plan.heads_q));
  Packed k = to_heads(comm, plan, k_local), v = to_heads(comm, plan, v_local);

  TileContext ctx = tile_context(config, s, args.in, dropout, args.rng.value_or(RngState{}));
  ctx.device = tiles.device;
  ctx.device_index = tiles.index;
  // dbias: an fp32 accumulator of the unsharded shape that every tile adds its share to.
  std::vector<float> dbias_acc(wants_dbias ? size_t(args.dbias.numel()) : 0, 0.0f);
  if (wants_dbias)
    ctx.dbias = TensorView::contiguous(
        dbias_acc.data(), DType::kFloat32,
        {args.dbias.shape[0], args.dbias.shape[1], args.dbias.shape[2], args.dbias.shape[3]});
  const std::vector<int> q_chunks = plan.group_chunks(plan.group);
  Packed dq_acc = zeros_f32(q.rows, q.heads, q.dim);
  BackendKind used = BackendKind::kAuto;

  // dalpha_h = -sum_i exp(sigma_h - LSE_i) D_i, once per row, from the final LSE. This rank's
  // partial covers its rows (and, under a2a, its heads).
  std::vector<float> dalpha(size_t(plan.heads_q), 0.0f);
  if (wants_dalpha)
    for (int64_t r = 0; r < q.rows; ++r)
      for (int64_t h = 0; h < q.heads; ++h) {
        const float row_lse = lse.f32()[r * q.heads + h];
        if (row_lse == kNegInf) continue;
        double d_row = 0.0;
        for (int64_t c = 0; c < dv_dim; ++c) {
          const int64_t n = (r * q.heads + h) * dv_dim + c;
          d_row += load_element(d_o.data(), d_o.dtype, n) * load_element(o.data(), o.dtype, n);
        }
        const int64_t global_head = ctx.head_offset + h;
        dalpha[size_t(global_head)] -=
            float(std::exp(sink_of(config, args.in.softmax_offset, global_head) - row_lse) * d_row);
      }

  auto attend = [&](const Packed& keys, const Packed& values, const std::vector<int>& kv_chunks,
                    Packed& dk_acc, Packed& dv_acc) {
    for (size_t qs = 0; qs < q_chunks.size(); ++qs)
      for (size_t ks = 0; ks < kv_chunks.size(); ++ks) {
        if (!tile_may_see(ctx, q_chunks[qs], kv_chunks[ks])) continue;
        TileBackwardIn in;
        in.q = {&q, int64_t(qs), q_chunks[qs]};
        in.o = {&o, int64_t(qs), q_chunks[qs]};
        in.d_o = {&d_o, int64_t(qs), q_chunks[qs]};
        in.k = {&keys, int64_t(ks), kv_chunks[ks]};
        in.v = {&values, int64_t(ks), kv_chunks[ks]};
        in.lse = &lse;
        TileBackwardOut tile = tile_backward(ctx, in);
        used = tile.backend;
        const int64_t rows_q = g.q.rows_per_chunk, rows_kv = g.kv.rows_per_chunk;
        accumulate_rows(dq_acc, int64_t(qs) * rows_q, tile.dq, 0, rows_q);
        accumulate_rows(dk_acc, int64_t(ks) * rows_kv, tile.dk, 0, rows_kv);
        accumulate_rows(dv_acc, int64_t(ks) * rows_kv, tile.dv, 0, rows_kv);
      }
  };

  Packed dk_acc = zeros_f32(k.rows, k.heads, k.dim), dv_acc = zeros_f32(v.rows, v.heads, v.dim);
  if (plan.all_gather) {
    const GatheredKv gathered = gather_needed(comm, plan, ctx, k, v);
    Packed dk_gathered = zeros_f32(gathered.k.rows, k.heads, k.dim);
    Packed dv_gathered = zeros_f32(gathered.v.rows, v.heads, v.dim);
    attend(gathered.k, gathered.v, gathered.chunks, dk_gathered, dv_gathered);
    return_gradients(comm, plan, ctx, gathered, dk_gathered, dv_gathered, dk_acc, dv_acc);
  } else {
    // KV travels the ring ahead of the compute; dKV follows it after each step and arrives
    // back at its owner after n transfers.
    const int n = plan.ring_size();
    Packed next_k = k, next_v = v, next_dk = dk_acc, next_dv = dv_acc;
    for (int step = 0; step < n; ++step) {
      std::vector<CommHandle> pending_kv;
      if (step + 1 < n) pending_kv = ring_exchange(comm, plan, k, v, next_k, next_v, kTagK, kTagV);
      attend(k, v, plan.group_chunks((plan.group - step + n) % n), dk_acc, dv_acc);
      if (n > 1) {
        std::vector<CommHandle> pending_dkv =
            ring_exchange(comm, plan, dk_acc, dv_acc, next_dk, next_dv, kTagDk, kTagDv);
        wait_all(pending_dkv);
        std::swap(dk_acc, next_dk);
        std::swap(dv_acc, next_dv);
      }
      wait_all(pending_kv);
      if (step + 1 < n) {
        std::swap(k, next_k);
        std::swap(v, next_v);
      }
    }
  }

  Packed dk_local = to_sequence(comm, plan, dk_acc), dv_local = to_sequence(comm, plan, dv_acc);
  if (plan.kv_replication > 1) {
    dk_local = sum_replicas(dk_local, plan.kv_replication);
    dv_local = sum_replicas(dv_local, plan.kv_replication);
  }
  unpack_local(g, g.q, to_sequence(comm, plan, dq_acc), args.dq);
  unpack_local(g, g.kv, dk_local, args.dk);
  unpack_local(g, g.kv, dv_local, args.dv);
  if (wants_dalpha) {
    if (cp_config.reduce_dalpha)
      comm.all_reduce(dalpha.data(), int64_t(dalpha.size()), DType::kFloat32)->wait();
    for (int64_t h = 0; h < plan.heads_q; ++h) store(args.dsoftmax_offset, h, dalpha[size_t(h)]);
  }
  if (wants_dbias) {
    if (cp_config.reduce_dbias)
      comm.all_reduce(dbias_acc.data(), int64_t(dbias_acc.size()), DType::kFloat32)->wait();
    for (int64_t n = 0; n < args.dbias.numel(); ++n) store(args.dbias, n, dbias_acc[size_t(n)]);
  }
  if (used == BackendKind::kAuto) used = BackendKind::kCpuExact;
  return used;
}

// ---- CUDA tensors: virtual ranks on one GPU ----
// The CP algorithm moves host buffers between ranks (in-process ranks are threads), so a call
// with CUDA tensors copies its inputs to the host, runs every tile on the device
// (tile.cc, device_stage.h) and copies its outputs back; it returns with the outputs in place
// (synchronous with respect to the caller's stream). Correct and simple, not fast: it is the
// single-GPU check of the GPU tiles, not the NCCL path.
class HostStaging {
 public:
  // Waits for the caller's stream first: its kernels may still be writing the inputs.
  HostStaging(const TensorView& q, void* stream) : device_index_(q.device_index) {
#if defined(DPA_WITH_CUDA)
    cuda::synchronize(stream, device_index_);
#else
    (void)stream;
#endif
  }

  // A host copy of an input on q's device (a host tensor passes through unchanged).
  TensorView in(const TensorView& t, const char* name) { return stage(t, name, true); }
  // A host copy of an output on q's device, copied back by copy_outputs_back(); copied in
  // first so that elements the call does not write keep their contents, as on the host.
  TensorView out(const TensorView& t, const char* name) {
    TensorView host = stage(t, name, true);
    if (t.defined() && t.device == Device::kCUDA) outputs_.push_back({t, host});
    return host;
  }
  // Returns once the outputs are in place, for any stream of the caller's.
  void copy_outputs_back() {
#if defined(DPA_WITH_CUDA)
    for (const auto& [device, host] : outputs_)
      cuda::copy_host_to_device(device.data, host.data, bytes(device), device_index_);
    cuda::synchronize(nullptr, device_index_);
#endif
  }

 private:
  static size_t bytes(const TensorView& t) { return size_t(t.numel()) * dtype_size(t.dtype); }

  TensorView stage(const TensorView& t, const char* name, bool copy_in) {
    if (!t.defined() || t.device == Device::kCPU) return t;
    require(t.device_index == device_index_, name, "must be on q's device");
    require(t.is_contiguous(), name,
            "must be contiguous under context parallelism with CUDA tensors (it is staged "
            "through the host)");
    buffers_.emplace_back(bytes(t));
    TensorView host = t;
    host.data = buffers_.back().data();
    host.device = Device::kCPU;
    host.device_index = 0;
#if defined(DPA_WITH_CUDA)
    if (copy_in) cuda::copy_device_to_host(host.data, t.data, bytes(t), device_index_);
#else
    (void)copy_in;
    throw Error(ErrorCode::kNotSupported, name, "CUDA tensors need a build with CUDA");
#endif
    return host;
  }

  int device_index_;
  std::deque<std::vector<unsigned char>> buffers_;  // stable addresses
  std::vector<std::pair<TensorView, TensorView>> outputs_;
};

void stage_inputs(HostStaging& staging, AttentionInputs& in) {
  for (auto [t, name] : {std::pair{&in.q, "q"},
                         {&in.k, "k"},
                         {&in.v, "v"},
                         {&in.softmax_offset, "softmax_offset"},
                         {&in.alibi_slopes, "alibi_slopes"},
                         {&in.bias, "bias"},
                         {&in.attn_mask, "attn_mask"},
                         {&in.cu_seqlens_q, "cu_seqlens_q"},
                         {&in.cu_seqlens_kv, "cu_seqlens_kv"},
                         {&in.cu_seqlens_q_padded, "cu_seqlens_q_padded"},
                         {&in.cu_seqlens_kv_padded, "cu_seqlens_kv_padded"}})
    *t = staging.in(*t, name);
}

ForwardResult forward(const AttentionConfig& config, const CpConfig& cp_config, Communicator& comm,
                      const ForwardArgs& args, double dropout, const RngState& rng,
                      const DebugOptions& debug, RingWorkspace* workspace) {
  if (NcclCommunicator* nccl = comm.device_communicator()) {
    // Device buffers: the device ring where it applies, else the general algorithms over
    // host buffers through a host-staged view of the same communicator.
    if (!debug.sink_per_tile && device_ring_refusal(config, cp_config, args.in, dropout).empty())
      return device_ring_forward(config, *nccl, args, rng, workspace);
    const std::unique_ptr<Communicator> staged = make_host_staged_communicator(*nccl);
    return forward(config, cp_config, *staged, args, dropout, rng, debug);
  }
  if (args.in.q.device != Device::kCUDA)
    return forward_staged(config, cp_config, comm, args, dropout, rng, debug, {});
  HostStaging staging(args.in.q, args.stream);
  ForwardArgs host = args;
  stage_inputs(staging, host.in);
  host.o = staging.out(args.o, "o");
  host.lse = staging.out(args.lse, "lse");
  const ForwardResult result = forward_staged(config, cp_config, comm, host, dropout, rng, debug,
                                              {Device::kCUDA, args.in.q.device_index});
  staging.copy_outputs_back();
  return result;
}

BackendKind backward(const AttentionConfig& config, const CpConfig& cp_config, Communicator& comm,
                     const BackwardArgs& args, double dropout, RingWorkspace* workspace) {
  if (NcclCommunicator* nccl = comm.device_communicator()) {
    if (device_ring_refusal(config, cp_config, args.in, dropout).empty())
      return device_ring_backward(config, cp_config, *nccl, args, workspace);
    const std::unique_ptr<Communicator> staged = make_host_staged_communicator(*nccl);
    return backward(config, cp_config, *staged, args, dropout);
  }
  if (args.in.q.device != Device::kCUDA)
    return backward_staged(config, cp_config, comm, args, dropout, {});
  HostStaging staging(args.in.q, args.stream);
  BackwardArgs host = args;
  stage_inputs(staging, host.in);
  host.o = staging.in(args.o, "o");
  host.d_o = staging.in(args.d_o, "d_o");
  host.lse = staging.in(args.lse, "lse");
  host.dq = staging.out(args.dq, "dq");
  host.dk = staging.out(args.dk, "dk");
  host.dv = staging.out(args.dv, "dv");
  host.dsoftmax_offset = staging.out(args.dsoftmax_offset, "dsoftmax_offset");
  host.dbias = staging.out(args.dbias, "dbias");
  const BackendKind used = backward_staged(config, cp_config, comm, host, dropout,
                                           {Device::kCUDA, args.in.q.device_index});
  staging.copy_outputs_back();
  return used;
}

}  // namespace dpa::cp

namespace dpa {

ContextParallelAttention::ContextParallelAttention(const AttentionConfig& config,
                                                   const CpConfig& cp, Communicator& communicator)
    : config_(config_with_environment(config, process_environment())),
      cp_(cp),
      comm_(communicator),
      ring_workspace_(cp::make_ring_workspace()) {
  validate_config(config_);
}

ForwardResult ContextParallelAttention::forward(const ForwardArgs& args) {
  const double dropout = args.dropout.value_or(config_.dropout);
  const RngState rng = call_rng_state(args.rng, config_.seed, next_offset_);
  ForwardResult result =
      cp::forward(config_, cp_, comm_, args, dropout, rng, {}, ring_workspace_.get());
  if (call_advances_offset(args.rng, dropout)) ++next_offset_;
  return result;
}

BackendKind ContextParallelAttention::backward(const BackwardArgs& args) {
  return cp::backward(config_, cp_, comm_, args, args.dropout.value_or(config_.dropout),
                      ring_workspace_.get());
}

}  // namespace dpa
