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
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "core/call_rng.h"
#include "core/element_access.h"
#include "core/environment.h"
#include "core/memory_overlap.h"
#include "core/problem_builder.h"
#include "cp/calls_in_flight.h"
#include "cp/comm_requests.h"
#include "cp/cp_exchange.h"
#include "cp/cp_internal.h"
#include "cp/cp_layout.h"
#include "cp/cp_setup.h"
#include "cp/device_ring.h"
#include "cp/device_sets.h"
#include "cp/sequence_tables.h"
#include "cp/tile.h"
#include "cp/window_gather.h"

namespace dpa::cp {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- The sink, once per row after the merge ----

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
  if (o_acc.place.on_device()) {
    merge_device_rows(set_rows(o_acc, first_row, tile.lse.rows),
                      lse_acc.f32_data() + first_row * heads, set_rows(tile.o, 0, tile.lse.rows),
                      tile.o.dtype, static_cast<const float*>(tile.lse.data()), heads, o_acc.place);
    return;
  }
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
              Packed& o_acc, Packed& lse_acc, int64_t first_row, int64_t rows) {
  const int64_t heads = lse_acc.heads, dv = o_acc.dim;
  for (int64_t h = 0; h < heads; ++h) {
    const float sigma = float(sink_of(config, offsets, head_offset + h));
    if (sigma == kNegInf) continue;
    for (int64_t r = first_row; r < first_row + rows; ++r) {
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

// The backend a call reports: where its tiles took different backends, the one furthest from
// the fast path (cuda_flash, cuda_unfused, cpu, cpu_exact), so that a fallback is never hidden
// behind the last tile's choice.
BackendKind slower_backend(BackendKind reported, BackendKind tile) {
  auto distance = [](BackendKind b) {
    switch (b) {
      case BackendKind::kAuto:
        return -1;
      case BackendKind::kCudaFlash:
        return 0;
      case BackendKind::kCudaUnfused:
        return 1;
      case BackendKind::kCpu:
        return 2;
      case BackendKind::kCpuExact:
        return 3;
    }
    return 3;
  };
  return distance(tile) > distance(reported) ? tile : reported;
}

// Which (query slot, key slot) pairs of a step an attend pass leaves out.
enum class TilePairs { kNone, kOwn, kAllButOwn };

// The slots of the rank's own chunks in the sets of its a2a group's first ring step (the group
// all-to-all stacks member d's chunks as block d): under a2a their tiles need no transfer.
// The pairs of two own slots run first, while the peers' blocks travel; `early_rows` of the own
// query slots take part (all by default; fewer leave the other own pairs to run last, under the
// backward's last returns).
struct OwnSlots {
  std::vector<size_t> slots;
  size_t first = 0, count = 0, early_rows = 0;
  OwnSlots(const Plan& plan, size_t group_chunks, size_t early_rows_wanted = size_t(-1)) {
    count = plan.a2a > 1 ? group_chunks / size_t(plan.a2a) : 0;
    first = size_t(plan.member) * count;
    early_rows = std::min(count, early_rows_wanted);
    for (size_t i = 0; i < count; ++i) slots.push_back(first + i);
  }
  bool overlaps() const { return count > 0; }
  bool owns(size_t slot) const { return slot >= first && slot < first + count; }
  // kOwn leaves out the pairs the first pass ran (two own slots, the query slot among the
  // first `early_rows`); kAllButOwn every other pair.
  bool skips(TilePairs skip, size_t q_slot, size_t k_slot) const {
    if (skip == TilePairs::kNone) return false;
    const bool early_pair = owns(q_slot) && owns(k_slot) && q_slot < first + early_rows;
    return skip == TilePairs::kOwn ? early_pair : !early_pair;
  }
};

// 0, 1, ..., n - 1: every slot of a set of n chunks.
std::vector<size_t> every_slot(size_t n) {
  std::vector<size_t> slots(n);
  for (size_t i = 0; i < n; ++i) slots[i] = i;
  return slots;
}

// After every tile of rows [first_row, first_row + rows): the sink once per row, and o in the
// storage dtype and the LSE written into `out`'s rows (device sets: one kernel).
struct FinalRows {
  Packed o, lse;
};
FinalRows final_rows_like(const Packed& o_acc, const Packed& lse_acc, DType dtype) {
  return {Packed::alike(o_acc, dtype, o_acc.rows, o_acc.heads, o_acc.dim),
          Packed::alike(lse_acc, DType::kFloat32, lse_acc.rows, lse_acc.heads, 1)};
}
void finish_rows(const AttentionConfig& config, const TensorView& offsets, int64_t head_offset,
                 Packed& o_acc, Packed& lse_acc, int64_t first_row, int64_t rows, FinalRows& out) {
  const int64_t heads = lse_acc.heads;
  if (!o_acc.place.on_device()) {
    add_sink(config, offsets, head_offset, o_acc, lse_acc, first_row, rows);
    const int64_t row_elements = heads * o_acc.dim;
    for (int64_t n = first_row * row_elements; n < (first_row + rows) * row_elements; ++n)
      store_element(out.o.data(), out.o.dtype, n, load_element(o_acc.data(), o_acc.dtype, n));
    for (int64_t n = first_row * heads; n < (first_row + rows) * heads; ++n)
      out.lse.f32()[n] = lse_acc.f32()[n];
    return;
  }
  const float* head_offsets =
      offsets.defined() ? static_cast<const float*>(offsets.data) + head_offset : nullptr;
  finalize_device_rows(set_rows(out.o, first_row, rows), out.o.dtype,
                       out.lse.f32_data() + first_row * heads, set_rows(o_acc, first_row, rows),
                       lse_acc.f32_data() + first_row * heads, heads, int(config.softmax_type),
                       head_offsets, o_acc.place);
}

}  // namespace

ForwardResult forward_staged(const AttentionConfig& config, const CpConfig& cp_config,
                             Communicator& comm, const ForwardArgs& args, double dropout,
                             const RngState& rng, const std::vector<const Backend*>& tile_backends,
                             const Placement& sets, CallsInFlight* in_flight) {
  CallScope scope(in_flight, sets);
  Setup s = setup(config, cp_config, comm, args.in);
  Transfers transfers(comm, sets.on_device(), sets.stream);
  const Geometry& g = s.geometry;
  const Plan& plan = s.plan;
  require_like(args.o, args.in.q, args.in.v.shape[args.in.v.ndim - 1], "o");
  require(args.lse.dtype == DType::kFloat32 && args.lse.device == args.in.q.device &&
              args.lse.device_index == args.in.q.device_index,
          "lse", "must be an fp32 tensor on q's device");

  Packed k_local = pack_local(g, g.kv, args.in.k, sets),
         v_local = pack_local(g, g.kv, args.in.v, sets);
  if (plan.kv_replication > 1) {
    k_local = replicate_heads(k_local, plan.kv_replication);
    v_local = replicate_heads(v_local, plan.kv_replication);
  }
  // Under a2a the rank's own rows of the group's heads are local: their tiles run while the
  // peers' rows are in flight.
  GroupExchange q_in = start_to_heads(comm, plan, pack_local(g, g.q, args.in.q, sets));
  GroupExchange k_in = start_to_heads(comm, plan, std::move(k_local));
  GroupExchange v_in = start_to_heads(comm, plan, std::move(v_local));
  start_pending(comm);
  const Packed& q = q_in.recv;
  Packed &k = k_in.recv, &v = v_in.recv;

  TileContext ctx = tile_context(config, s, args.in, dropout, rng);
  ctx.backends = &tile_backends;
  ctx.sets = sets;
  const std::vector<int> q_chunks = plan.group_chunks(plan.group);
  const OwnSlots own(plan, q_chunks.size());
  Packed o_acc = zeros_f32(q.rows, q.heads, v.dim, sets);
  Packed lse_acc(DType::kFloat32, q.rows, q.heads, 1, sets);
  fill(lse_acc, kNegInf);
  BackendKind used = BackendKind::kAuto;

  // The tiles of query slots [q_begin, q_end) (all by default) against key slots `slots` of a
  // set holding `kv_chunks`, but for the pairs `skip` names.
  auto attend = [&](const Packed& keys, const Packed& values, const std::vector<int>& kv_chunks,
                    const std::vector<size_t>& slots, TilePairs skip = TilePairs::kNone,
                    size_t q_begin = 0, size_t q_end = size_t(-1)) {
    for (size_t qs = q_begin; qs < std::min(q_end, q_chunks.size()); ++qs)
      for (size_t ks : slots) {
        if (own.skips(skip, qs, ks)) continue;
        if (!tile_may_see(ctx, q_chunks[qs], kv_chunks[ks])) continue;
        TileForwardOut tile =
            tile_forward(ctx, {&q, int64_t(qs), q_chunks[qs]}, {&keys, int64_t(ks), kv_chunks[ks]},
                         {&values, int64_t(ks), kv_chunks[ks]});
        used = slower_backend(used, tile.backend);
        merge_partial(o_acc, lse_acc, int64_t(qs) * g.q.rows_per_chunk, tile);
      }
  };

  // Under a2a each group member's rows of o and the LSE go back to it as soon as the last ring
  // step's tiles of those rows are done (exchange_output_block), the peers' rows first and the
  // rank's own last, so that the outputs travel while the remaining tiles run.
  FinalRows final_rows;
  OutputExchange o_out, lse_out;
  if (own.overlaps()) {
    final_rows = final_rows_like(o_acc, lse_acc, q.dtype);
    o_out.recv = Packed::alike(final_rows.o, q.dtype, q.rows, q.heads, v.dim);
    lse_out.recv = Packed::alike(final_rows.lse, DType::kFloat32, q.rows, q.heads, 1);
  }
  // The last ring step's tiles block by block: round r's block is member + r's query slots.
  auto attend_and_return_by_block = [&](const std::vector<int>& chunks, TilePairs skip) {
    const int64_t rows = int64_t(own.count) * g.q.rows_per_chunk;
    for (int step = 1; step <= plan.a2a; ++step) {
      const int round = step % plan.a2a;
      const size_t block = size_t((plan.member + round) % plan.a2a);
      attend(k, v, chunks, every_slot(chunks.size()), skip, block * own.count,
             (block + 1) * own.count);
      finish_rows(config, args.in.softmax_offset, ctx.head_offset, o_acc, lse_acc,
                  int64_t(block) * rows, rows, final_rows);
      exchange_output_block(comm, plan, final_rows.o, round, o_out);
      exchange_output_block(comm, plan, final_rows.lse, round, lse_out);
      start_pending(comm);
    }
  };

  // The own rows' tiles of the first ring step while the peers' rows are in flight.
  const bool own_first = !plan.all_gather && own.overlaps();
  if (own_first) attend(k, v, q_chunks, own.slots, TilePairs::kAllButOwn);
  for (GroupExchange* in : {&q_in, &k_in, &v_in}) in->finish(transfers);
  if (plan.all_gather) {
    // This rank's own chunks first, while the peers' are in flight.
    GatheredKv gathered = gather_needed(comm, plan, ctx, k, v);
    attend(gathered.k, gathered.v, gathered.chunks, gathered.own_slots);
    transfers.settle(gathered.pending);
    attend(gathered.k, gathered.v, gathered.chunks, gathered.peer_slots);
  } else {
    const int n = plan.ring_size();
    // Receive buffers (every one is received into before it is read).
    Packed next_k = Packed::alike(k, k.dtype, k.rows, k.heads, k.dim);
    Packed next_v = Packed::alike(v, v.dtype, v.rows, v.heads, v.dim);
    for (int step = 0; step < n; ++step) {
      const std::vector<int> chunks = plan.group_chunks((plan.group - step + n) % n);
      std::vector<CommHandle> pending;
      if (step + 1 < n) pending = ring_exchange(comm, plan, k, v, next_k, next_v, kTagK, kTagV);
      const TilePairs skip = step == 0 && own_first ? TilePairs::kOwn : TilePairs::kNone;
      if (step + 1 == n && own.overlaps())
        attend_and_return_by_block(chunks, skip);
      else
        attend(k, v, chunks, every_slot(chunks.size()), skip);
      transfers.settle(pending);
      if (step + 1 < n) {
        std::swap(k, next_k);
        std::swap(v, next_v);
      }
    }
  }
  if (own.overlaps()) {
    transfers.settle(o_out.pending);
    transfers.settle(lse_out.pending);
    unpack_local(g, g.q, merge_heads(o_out.recv, plan.a2a), args.o);
    unpack_lse(g, merge_heads(lse_out.recv, plan.a2a), args.lse);
  } else {  // no a2a: the rows stay here
    final_rows = final_rows_like(o_acc, lse_acc, q.dtype);
    finish_rows(config, args.in.softmax_offset, ctx.head_offset, o_acc, lse_acc, 0, q.rows,
                final_rows);
    unpack_local(g, g.q, final_rows.o, args.o);
    unpack_lse(g, final_rows.lse, args.lse);
  }
  scope.finish(transfers);
  if (used == BackendKind::kAuto) used = BackendKind::kCpuExact;  // no visible tile on this rank
  return {used, rng};
}

BackendKind backward_staged(const AttentionConfig& config, const CpConfig& cp_config,
                            Communicator& comm, const BackwardArgs& args, double dropout,
                            const std::vector<const Backend*>& tile_backends, const Placement& sets,
                            CallsInFlight* in_flight) {
  CallScope scope(in_flight, sets);
  Setup s = setup(config, cp_config, comm, args.in);
  Transfers transfers(comm, sets.on_device(), sets.stream);
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
                args.dbias.ndim == 4 && args.dbias.device == args.in.q.device &&
                args.dbias.device_index == args.in.q.device_index,
            "dbias", "must be a contiguous tensor with bias's dtype, on q's device");
    for (int d = 0; d < 4; ++d)
      require(args.dbias.shape[d] == args.in.bias.shape[d], "dbias",
              [&] { return "must have the shape of bias " + args.in.bias.shape_string(); });
  }
  const bool wants_dalpha = args.dsoftmax_offset.ndim > 0;
  if (wants_dalpha)
    require(config.softmax_type == SoftmaxType::kLearnable &&
                args.dsoftmax_offset.dtype == DType::kFloat32 &&
                args.dsoftmax_offset.numel() == plan.heads_q &&
                args.dsoftmax_offset.is_contiguous(),
            "dsoftmax_offset", "must be a contiguous fp32 [H] tensor (softmax_type learnable)");
  if (wants_dalpha)
    require(args.dsoftmax_offset.device == args.in.q.device &&
                args.dsoftmax_offset.device_index == args.in.q.device_index,
            "dsoftmax_offset", "must be on q's device");
  require(args.lse.dtype == DType::kFloat32 && args.lse.device == args.in.q.device &&
              args.lse.device_index == args.in.q.device_index,
          "lse", "must be an fp32 tensor on q's device");

  Packed k_local = pack_local(g, g.kv, args.in.k, sets),
         v_local = pack_local(g, g.kv, args.in.v, sets);
  if (plan.kv_replication > 1) {
    k_local = replicate_heads(k_local, plan.kv_replication);
    v_local = replicate_heads(v_local, plan.kv_replication);
  }
  // Under a2a the rank's own rows of the group's heads are local: their tiles run while the
  // peers' rows are in flight (as in the forward).
  GroupExchange q_in = start_to_heads(comm, plan, pack_local(g, g.q, args.in.q, sets));
  GroupExchange o_in = start_to_heads(comm, plan, pack_local(g, g.q, args.o, sets));
  GroupExchange d_o_in = start_to_heads(comm, plan, pack_local(g, g.q, args.d_o, sets));
  GroupExchange lse_in = start_to_heads(comm, plan, pack_lse(g, args.lse, plan.heads_q, sets));
  GroupExchange k_in = start_to_heads(comm, plan, std::move(k_local));
  GroupExchange v_in = start_to_heads(comm, plan, std::move(v_local));
  start_pending(comm);
  const Packed &q = q_in.recv, &o = o_in.recv, &d_o = d_o_in.recv, &lse = lse_in.recv;
  Packed &k = k_in.recv, &v = v_in.recv;

  TileContext ctx = tile_context(config, s, args.in, dropout, args.rng.value_or(RngState{}));
  ctx.backends = &tile_backends;
  ctx.sets = sets;
  // dbias: an fp32 accumulator of the unsharded shape that every tile adds its share to (on the
  // device with device sets).
  std::vector<float> dbias_acc(wants_dbias && !sets.on_device() ? size_t(args.dbias.numel()) : 0,
                               0.0f);
  Packed device_dbias;
  if (wants_dbias && sets.on_device()) {
    const int64_t* shape = args.dbias.shape.data();  // rows of keys: the conversion's rows
    device_dbias = zeros_f32(shape[0] * shape[1] * shape[2], 1, shape[3], sets);
    ctx.dbias = TensorView::contiguous(
        device_dbias.data(), DType::kFloat32,
        {args.dbias.shape[0], args.dbias.shape[1], args.dbias.shape[2], args.dbias.shape[3]},
        Device::kCUDA);
    ctx.dbias.device_index = sets.index;
  } else if (wants_dbias) {
    ctx.dbias = TensorView::contiguous(
        dbias_acc.data(), DType::kFloat32,
        {args.dbias.shape[0], args.dbias.shape[1], args.dbias.shape[2], args.dbias.shape[3]});
  }
  const std::vector<int> q_chunks = plan.group_chunks(plan.group);
  Packed dq_acc = zeros_f32(q.rows, q.heads, q.dim, sets);
  BackendKind used = BackendKind::kAuto;

  // Under pure a2a the first pass takes the own pairs of the first own query slot only: they
  // outlast the inputs' transfer, and the rest run in the last L, under the last peer block's
  // dk and dv on their way back (which nothing else could hide).
  const bool pure_a2a = !plan.all_gather && plan.ring_size() == 1;
  const OwnSlots own(plan, q_chunks.size(), pure_a2a ? 1 : size_t(-1));
  // The tiles of query slots [q_begin, q_end) (all by default) against key slots `slots`.
  auto attend = [&](const Packed& keys, const Packed& values, const std::vector<int>& kv_chunks,
                    const std::vector<size_t>& slots, Packed& dk_acc, Packed& dv_acc,
                    TilePairs skip = TilePairs::kNone, size_t q_begin = 0,
                    size_t q_end = size_t(-1)) {
    for (size_t qs = q_begin; qs < std::min(q_end, q_chunks.size()); ++qs)
      for (size_t ks : slots) {
        if (own.skips(skip, qs, ks)) continue;
        if (!tile_may_see(ctx, q_chunks[qs], kv_chunks[ks])) continue;
        TileBackwardIn in;
        in.q = {&q, int64_t(qs), q_chunks[qs]};
        in.o = {&o, int64_t(qs), q_chunks[qs]};
        in.d_o = {&d_o, int64_t(qs), q_chunks[qs]};
        in.k = {&keys, int64_t(ks), kv_chunks[ks]};
        in.v = {&values, int64_t(ks), kv_chunks[ks]};
        in.lse = &lse;
        TileBackwardOut tile = tile_backward(ctx, in);
        used = slower_backend(used, tile.backend);
        const int64_t rows_q = g.q.rows_per_chunk, rows_kv = g.kv.rows_per_chunk;
        accumulate_rows(dq_acc, int64_t(qs) * rows_q, tile.dq, 0, rows_q);
        accumulate_rows(dk_acc, int64_t(ks) * rows_kv, tile.dk, 0, rows_kv);
        accumulate_rows(dv_acc, int64_t(ks) * rows_kv, tile.dv, 0, rows_kv);
      }
  };

  Packed dk_acc = zeros_f32(k.rows, k.heads, k.dim, sets),
         dv_acc = zeros_f32(v.rows, v.heads, v.dim, sets);
  // The own rows' tiles of the first ring step while the peers' rows are in flight.
  const bool own_first = !plan.all_gather && own.overlaps();
  if (own_first) attend(k, v, q_chunks, own.slots, dk_acc, dv_acc, TilePairs::kAllButOwn);
  for (GroupExchange* in : {&q_in, &o_in, &d_o_in, &lse_in, &k_in, &v_in}) in->finish(transfers);

  // dalpha_h = -sum_i exp(sigma_h - LSE_i) D_i, once per row, from the final LSE. This rank's
  // partial covers its rows (and, under a2a, its heads). Device sets: one kernel with a fixed
  // reduction order writes the local heads of an fp32 [H] set.
  std::vector<float> dalpha(size_t(plan.heads_q), 0.0f);
  Packed device_dalpha;
  if (wants_dalpha && sets.on_device()) {
    device_dalpha = zeros_f32(plan.heads_q, 1, 1, sets);
    sink_gradient_device(
        device_dalpha.f32_data() + ctx.head_offset, set_rows(o, 0, q.rows),
        set_rows(d_o, 0, q.rows), o.dtype, static_cast<const float*>(lse.data()), q.heads,
        static_cast<const float*>(args.in.softmax_offset.data) + ctx.head_offset, sets);
  } else if (wants_dalpha) {
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
  }

  OutputExchange dq_out;  // under a2a: dq's rows on their way back (the ring's last step)
  // And dk's and dv's, straight to their owners: under a2a+p2p the last step's key rows belong
  // to the next ring position's group (the ring's last hop and the all-to-all in one transfer).
  const bool returns_dkv_by_block = !plan.all_gather && own.overlaps();
  const int dkv_ring_offset = pure_a2a ? 0 : 1;
  OutputExchange dk_out, dv_out;
  if (plan.all_gather) {
    // The own chunks' tiles are split around the peers': the first query slot's run while the
    // peers' chunks arrive, the rest while the peers' chunks' dK/dV (fp32, twice the bytes)
    // travel back to their owners.
    GatheredKv gathered = gather_needed(comm, plan, ctx, k, v);
    Packed dk_gathered = zeros_f32(gathered.k.rows, k.heads, k.dim, sets);
    Packed dv_gathered = zeros_f32(gathered.v.rows, v.heads, v.dim, sets);
    attend(gathered.k, gathered.v, gathered.chunks, gathered.own_slots, dk_gathered, dv_gathered,
           TilePairs::kNone, 0, 1);
    transfers.settle(gathered.pending);
    attend(gathered.k, gathered.v, gathered.chunks, gathered.peer_slots, dk_gathered, dv_gathered);
    ReturningGradients returning =
        start_returning_gradients(comm, plan, ctx, gathered, dk_gathered, dv_gathered);
    attend(gathered.k, gathered.v, gathered.chunks, gathered.own_slots, dk_gathered, dv_gathered,
           TilePairs::kNone, 1);
    finish_returning_gradients(returning, plan, gathered, dk_gathered, dv_gathered, dk_acc, dv_acc,
                               transfers);
  } else {
    // KV travels the ring ahead of the compute; dKV follows it after each step and arrives
    // back at its owner after n transfers.
    const int n = plan.ring_size();
    // Receive buffers (every one is received into before it is read).
    Packed next_k = Packed::alike(k, k.dtype, k.rows, k.heads, k.dim);
    Packed next_v = Packed::alike(v, v.dtype, v.rows, v.heads, v.dim);
    Packed next_dk = Packed::alike(dk_acc, DType::kFloat32, dk_acc.rows, dk_acc.heads, dk_acc.dim);
    Packed next_dv = Packed::alike(dv_acc, DType::kFloat32, dv_acc.rows, dv_acc.heads, dv_acc.dim);
    if (own.overlaps())
      dq_out.recv = Packed::alike(dq_acc, DType::kFloat32, dq_acc.rows, dq_acc.heads, dq_acc.dim);
    for (int step = 0; step < n; ++step) {
      std::vector<CommHandle> pending_kv;
      if (step + 1 < n) pending_kv = ring_exchange(comm, plan, k, v, next_k, next_v, kTagK, kTagV);
      const std::vector<int> chunks = plan.group_chunks((plan.group - step + n) % n);
      const TilePairs skip = step == 0 && own_first ? TilePairs::kOwn : TilePairs::kNone;
      if (step + 1 == n && own.overlaps()) {
        // Under a2a the last step's tiles form a grid of member blocks (query rows x key rows),
        // run L by L: member block B_i = member + i (i = 1 .. a, the peers' first, the rank's
        // own last) takes its row against the key blocks B_i .. B_a, then its column against
        // the query blocks B_i+1 .. B_a. After its row B_i's dq rows are final and go back to
        // it (exchange_output_block); after its column its dk and dv rows go to their owner
        // (under a2a+p2p in the next ring position's group). Each transfer runs under the
        // later Ls' tiles.
        // dk's and dv's blocks are received into the ring's dKV receive buffers, which the
        // last step no longer uses (its dKV goes straight to the owners): no third fp32 dKV
        // set on top of the accumulators and the ring's.
        dk_out.recv = std::move(next_dk);
        dv_out.recv = std::move(next_dv);
        auto member_block = [&](int i) { return size_t((plan.member + i) % plan.a2a); };
        auto key_slots = [&](int from) {  // the key slots of blocks B_from .. B_a
          std::vector<size_t> slots;
          for (int j = from; j <= plan.a2a; ++j)
            for (size_t c = 0; c < own.count; ++c) slots.push_back(member_block(j) * own.count + c);
          return slots;
        };
        for (int i = 1; i <= plan.a2a; ++i) {
          const int round = i % plan.a2a;
          const size_t block = member_block(i);
          attend(k, v, chunks, key_slots(i), dk_acc, dv_acc, skip, block * own.count,
                 (block + 1) * own.count);
          exchange_output_block(comm, plan, dq_acc, round, dq_out, kTagA2ADq);
          start_pending(comm);
          std::vector<size_t> column(own.count);
          for (size_t c = 0; c < own.count; ++c) column[c] = block * own.count + c;
          for (int j = i + 1; j <= plan.a2a; ++j)
            attend(k, v, chunks, column, dk_acc, dv_acc, skip, member_block(j) * own.count,
                   (member_block(j) + 1) * own.count);
          exchange_output_block(comm, plan, dk_acc, round, dk_out, kTagA2ADk, dkv_ring_offset);
          exchange_output_block(comm, plan, dv_acc, round, dv_out, kTagA2ADv, dkv_ring_offset);
          start_pending(comm);
        }
      } else {
        attend(k, v, chunks, every_slot(chunks.size()), dk_acc, dv_acc, skip);
      }
      if (n > 1 && !(step + 1 == n && returns_dkv_by_block)) {
        std::vector<CommHandle> pending_dkv =
            ring_exchange(comm, plan, dk_acc, dv_acc, next_dk, next_dv, kTagDk, kTagDv);
        transfers.settle(pending_dkv);
        std::swap(dk_acc, next_dk);
        std::swap(dv_acc, next_dv);
      }
      transfers.settle(pending_kv);
      if (step + 1 < n) {
        std::swap(k, next_k);
        std::swap(v, next_v);
      }
    }
  }

  Packed dk_local, dv_local;
  if (returns_dkv_by_block) {
    transfers.settle(dk_out.pending);
    transfers.settle(dv_out.pending);
    dk_local = merge_heads(dk_out.recv, plan.a2a);
    dv_local = merge_heads(dv_out.recv, plan.a2a);
  } else {
    dk_local = to_sequence(comm, plan, std::move(dk_acc), transfers);
    dv_local = to_sequence(comm, plan, std::move(dv_acc), transfers);
  }
  if (plan.kv_replication > 1) {
    dk_local = sum_replicas(dk_local, plan.kv_replication);
    dv_local = sum_replicas(dv_local, plan.kv_replication);
  }
  if (own.overlaps()) {
    transfers.settle(dq_out.pending);
    unpack_local(g, g.q, merge_heads(dq_out.recv, plan.a2a), args.dq);
  } else {
    unpack_local(g, g.q, dq_acc, args.dq);  // no a2a: the rows stay here
  }
  unpack_local(g, g.kv, dk_local, args.dk);
  unpack_local(g, g.kv, dv_local, args.dv);
  // A device reduction is settled onto the stream as the exchanges are; a host one is waited for.
  auto reduce_on_device = [&](Packed& sum, int64_t count) {
    order_for_comm(comm, sum);
    std::vector<CommHandle> reduction;
    reduction.push_back(comm.all_reduce(sum.data(), count, DType::kFloat32));
    transfers.settle(reduction);
  };
  if (wants_dalpha && sets.on_device()) {
    if (cp_config.reduce_dalpha) reduce_on_device(device_dalpha, plan.heads_q);
    copy_bytes(args.dsoftmax_offset.data, device_dalpha.data(), device_dalpha.size_bytes(), sets);
  } else if (wants_dalpha) {
    if (cp_config.reduce_dalpha)
      comm.all_reduce(dalpha.data(), int64_t(dalpha.size()), DType::kFloat32)->wait();
    for (int64_t h = 0; h < plan.heads_q; ++h) store(args.dsoftmax_offset, h, dalpha[size_t(h)]);
  }
  if (wants_dbias && sets.on_device()) {
    if (cp_config.reduce_dbias) reduce_on_device(device_dbias, args.dbias.numel());
    // dbias is contiguous: its elements are the accumulator's, in order.
    const Packed out = convert(device_dbias, args.dbias.dtype);
    copy_bytes(args.dbias.data, out.data(), out.size_bytes(), sets);
  } else if (wants_dbias) {
    if (cp_config.reduce_dbias)
      comm.all_reduce(dbias_acc.data(), int64_t(dbias_acc.size()), DType::kFloat32)->wait();
    for (int64_t n = 0; n < args.dbias.numel(); ++n) store(args.dbias, n, dbias_acc[size_t(n)]);
  }
  scope.finish(transfers);
  if (used == BackendKind::kAuto) used = BackendKind::kCpuExact;
  return used;
}

namespace {

// Whether a call over a device communicator keeps its chunk sets on the device: CUDA tensors
// do, on the communicator's device (another device is an error, not a slower path); host
// tensors go through a host-staged view of the communicator.
bool device_resident(const DeviceCommunicator& comm, const AttentionInputs& in) {
  if (in.q.device != Device::kCUDA) return false;
  require(in.q.device_index == comm.device(), "q", [&] {
    return "is on CUDA device " + std::to_string(in.q.device_index) + ", the communicator on " +
           std::to_string(comm.device());
  });
  return true;
}

// The device-resident call's placement: chunk sets and tiles on q's device, on the caller's
// stream.
Placement resident_placement(const TensorView& q, void* stream) {
  return {Device::kCUDA, q.device_index, stream};
}

// CUDA tensors over a host communicator: a host-bounced device view of it, so that the chunk
// sets and tiles stay on the GPU and only the messages cross the host.
bool needs_bounce(Communicator& comm, const AttentionInputs& in) {
  return in.q.device == Device::kCUDA && comm.device_communicator() == nullptr;
}

}  // namespace

ForwardResult forward(const AttentionConfig& config, const CpConfig& cp_config, Communicator& comm,
                      const ForwardArgs& args, double dropout, const RngState& rng,
                      const CallState& state, const std::vector<const Backend*>& tile_backends) {
  if (needs_bounce(comm, args.in)) {
    // Synchronous: the bounced view, and so its handles, go with this call.
    const std::unique_ptr<DeviceCommunicator> bounced =
        make_host_bounced_communicator(comm, args.in.q.device_index);
    return forward(config, cp_config, *bounced, args, dropout, rng, {state.workspace, nullptr},
                   tile_backends);
  }
  DeviceCommunicator* device_comm = comm.device_communicator();
  if (device_comm == nullptr)  // host tensors over a host communicator
    return forward_staged(config, cp_config, comm, args, dropout, rng, tile_backends, {}, nullptr);
  // Device buffers: the device ring where it applies, else the general algorithms with their
  // chunk sets on the device, else (host tensors) through a host-staged view of the same
  // communicator.
  const bool registry = &tile_backends == &registered_backends();
  if (registry && device_ring_refusal(config, cp_config, args.in, dropout).empty())
    return device_ring_forward(config, *device_comm, args, rng, state.workspace, state.in_flight);
  if (device_resident(*device_comm, args.in)) {
    ForwardArgs resident = args;
    SequenceTables tables;
    tables.to_host(resident.in, args.stream, state.in_flight);
    return forward_staged(config, cp_config, *device_comm, resident, dropout, rng, tile_backends,
                          resident_placement(args.in.q, args.stream), state.in_flight);
  }
  const std::unique_ptr<Communicator> staged = make_host_staged_communicator(*device_comm);
  return forward_staged(config, cp_config, *staged, args, dropout, rng, tile_backends, {}, nullptr);
}

BackendKind backward(const AttentionConfig& config, const CpConfig& cp_config, Communicator& comm,
                     const BackwardArgs& args, double dropout, const CallState& state,
                     const std::vector<const Backend*>& tile_backends) {
  if (needs_bounce(comm, args.in)) {
    const std::unique_ptr<DeviceCommunicator> bounced =
        make_host_bounced_communicator(comm, args.in.q.device_index);
    return backward(config, cp_config, *bounced, args, dropout, {state.workspace, nullptr},
                    tile_backends);
  }
  DeviceCommunicator* device_comm = comm.device_communicator();
  if (device_comm == nullptr)
    return backward_staged(config, cp_config, comm, args, dropout, tile_backends, {}, nullptr);
  const bool registry = &tile_backends == &registered_backends();
  if (registry && device_ring_refusal(config, cp_config, args.in, dropout).empty())
    return device_ring_backward(config, cp_config, *device_comm, args, state.workspace,
                                state.in_flight);
  if (device_resident(*device_comm, args.in)) {
    BackwardArgs resident = args;
    SequenceTables tables;
    tables.to_host(resident.in, args.stream, state.in_flight);
    return backward_staged(config, cp_config, *device_comm, resident, dropout, tile_backends,
                           resident_placement(args.in.q, args.stream), state.in_flight);
  }
  const std::unique_ptr<Communicator> staged = make_host_staged_communicator(*device_comm);
  return backward_staged(config, cp_config, *staged, args, dropout, tile_backends, {}, nullptr);
}

}  // namespace dpa::cp

namespace dpa {

ContextParallelAttention::ContextParallelAttention(const AttentionConfig& config,
                                                   const CpConfig& cp, Communicator& communicator)
    : config_(config_with_environment(config, process_environment())),
      cp_(cp),
      comm_(communicator),
      ring_workspace_(cp::make_ring_workspace()),
      calls_in_flight_(std::make_shared<cp::CallsInFlight>()) {
  validate_config(config_);
}

ForwardResult ContextParallelAttention::forward(const ForwardArgs& args) {
  require_forward_outputs_apart(args);  // this rank's views; before any exchange
  const double dropout = args.dropout.value_or(config_.dropout);
  const RngState rng = call_rng_state(args.rng, config_.seed, next_offset_);
  ForwardResult result = cp::forward(config_, cp_, comm_, args, dropout, rng,
                                     {ring_workspace_.get(), calls_in_flight_.get()});
  if (call_advances_offset(args.rng, dropout)) ++next_offset_;
  return result;
}

BackendKind ContextParallelAttention::backward(const BackwardArgs& args) {
  require_backward_outputs_apart(args);
  return cp::backward(config_, cp_, comm_, args, args.dropout.value_or(config_.dropout),
                      {ring_workspace_.get(), calls_in_flight_.get()});
}

void ContextParallelAttention::synchronize() { calls_in_flight_->wait(); }

}  // namespace dpa
