#include "cp/tile.h"

#include <algorithm>
#include <limits>

#include "core/problem_builder.h"
#include "core/selector.h"
#include "cp/device_sets.h"

namespace dpa::cp {
namespace {

// int32 [b + 1] tables of one tile side: valid lengths and row offsets inside the chunk slot.
struct SideTables {
  std::vector<int32_t> cu, cu_padded;
  TensorView cu_view() {
    return TensorView::contiguous(cu.data(), DType::kInt32, {int64_t(cu.size())});
  }
  TensorView padded_view() {
    return TensorView::contiguous(cu_padded.data(), DType::kInt32, {int64_t(cu_padded.size())});
  }
};

SideTables side_tables(const Geometry& g, const SideGeometry& side, int chunk) {
  SideTables t;
  t.cu.push_back(0);
  for (int64_t b = 0; b < g.batch; ++b) {
    t.cu.push_back(t.cu.back() + int32_t(side.valid(b, chunk)));
    t.cu_padded.push_back(int32_t(side.prefix[size_t(b)]));
  }
  t.cu_padded.push_back(int32_t(side.rows_per_chunk));
  return t;
}

// The tile's sink offsets and ALiBi slopes: the local heads' slice of the full tensors.
struct HeadSlices {
  std::vector<float> alibi;  // [b, Hl] copy when the slopes are per batch
  Packed device_alibi;       // the same on the device, for device-resident tiles
  TensorView softmax_offset, alibi_slopes;
};

HeadSlices head_slices(const TileContext& ctx, int64_t local_heads) {
  HeadSlices s;
  // A slice of a full [H] tensor, on its device.
  auto slice = [&](const TensorView& full) {
    TensorView v = TensorView::contiguous(static_cast<float*>(full.data) + ctx.head_offset,
                                          DType::kFloat32, {local_heads}, full.device);
    v.device_index = full.device_index;
    return v;
  };
  if (ctx.softmax_offset.defined()) s.softmax_offset = slice(ctx.softmax_offset);
  if (ctx.alibi_slopes.defined()) {
    const TensorView& a = ctx.alibi_slopes;
    if (a.ndim == 1) {
      s.alibi_slopes = slice(a);
    } else if (ctx.sets.on_device()) {  // the slopes are on the device too: a strided copy
      const int64_t batch = a.shape[0];
      s.device_alibi = Packed(DType::kFloat32, batch, local_heads, 1, ctx.sets);
      copy_rows(s.device_alibi.data(), size_t(local_heads) * sizeof(float),
                static_cast<float*>(a.data) + ctx.head_offset, size_t(a.shape[1]) * sizeof(float),
                size_t(local_heads) * sizeof(float), size_t(batch), ctx.sets);
      s.alibi_slopes = TensorView::contiguous(s.device_alibi.data(), DType::kFloat32,
                                              {batch, local_heads}, Device::kCUDA);
      s.alibi_slopes.device_index = ctx.sets.index;
    } else {
      const int64_t batch = a.shape[0];
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t h = 0; h < local_heads; ++h)
          s.alibi.push_back(static_cast<float*>(a.data)[b * a.shape[1] + ctx.head_offset + h]);
      s.alibi_slopes =
          TensorView::contiguous(s.alibi.data(), DType::kFloat32, {batch, local_heads});
    }
  }
  return s;
}

void set_tile_fields(const TileContext& ctx, int q_chunk, int kv_chunk, AttentionProblem& p) {
  const Geometry& g = *ctx.geometry;
  p.cp.q_position.resize(size_t(g.batch));
  p.cp.kv_position.resize(size_t(g.batch));
  p.cp.global_diagonal = g.diagonal;
  for (int64_t b = 0; b < g.batch; ++b) {
    p.cp.q_position[size_t(b)] = g.q.position(b, q_chunk);
    p.cp.kv_position[size_t(b)] = g.kv.position(b, kv_chunk);
  }
  p.cp.head_offset = ctx.head_offset;
  p.cp.heads_total = ctx.heads_total;
}

// The tiles' problems are built without bias and mask (their shapes are the unsharded ones,
// which the builder would check against the tile's); attach_aux sets them afterwards.
AttentionConfig tile_config(const TileContext& ctx) {
  AttentionConfig config = ctx.config;
  config.format = Format::kTHD;  // a chunk slot is a thd tensor (cp_layout.h)
  config.bias_type = BiasType::kNoBias;
  if (config.mask_type == MaskType::kArbitrary) config.mask_type = MaskType::kNoMask;
  return config;
}

void attach_aux(const TileContext& ctx, AttentionProblem& p) {
  if (ctx.bias.defined()) {
    p.bias_type = ctx.bias_type;
    p.bias = ctx.bias;
    p.bias_layout = BroadcastLayout::of(ctx.bias);
    p.cp.aux_global = true;
  }
  if (ctx.attn_mask.defined()) {
    p.mask_type = MaskType::kArbitrary;
    p.has_attn_mask = true;
    p.attn_mask = ctx.attn_mask;
    p.mask_layout = BroadcastLayout::of(ctx.attn_mask);
    p.cp.aux_global = true;
  }
  if (p.pass == Pass::kBackward && ctx.dbias.defined()) {
    p.dbias = ctx.dbias;
    p.dbias_layout = BroadcastLayout::of(ctx.dbias);
    p.wants_dbias = true;
  }
}

// Device-resident tiles: [Hl, rows] (the backends' thd LSE) <-> the rows [rows, Hl] of a set.
void copy_lse_heads(float* heads_major, float* rows_major, int64_t heads, int64_t rows,
                    bool to_rows, const Placement& where) {
  const int64_t by_heads[2] = {rows, 1}, by_rows[2] = {1, heads};  // (head, row)
  if (to_rows)
    copy_strided(rows_major, by_rows, heads_major, by_heads, heads, rows, where);
  else
    copy_strided(heads_major, by_heads, rows_major, by_rows, heads, rows, where);
}

// A device view of an fp32 [heads, rows] scratch set.
TensorView heads_major_view(const Packed& scratch, int64_t heads, int64_t rows) {
  TensorView v = TensorView::contiguous(const_cast<void*>(scratch.data()), DType::kFloat32,
                                        {heads, rows}, Device::kCUDA);
  v.device_index = scratch.place.index;
  return v;
}

// [Hl, rows] (the backends' thd LSE) <-> Packed [rows, Hl, 1].
Packed lse_from_heads_major(const std::vector<float>& lse, int64_t heads, int64_t rows) {
  Packed out(DType::kFloat32, rows, heads, 1);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t r = 0; r < rows; ++r) out.f32()[r * heads + h] = lse[size_t(h * rows + r)];
  return out;
}

// A tile-local fp32 bias gradient [b, H|1, sq|1, skv] of the tile's own sizes (the layout
// cuda_unfused's reduction writes), kept apart per sequence: sequences sit at different global
// rows, so even a batch-broadcast dbias is summed only when it is placed.
struct TileDbias {
  int64_t batch = 0, heads = 0, rows = 0, cols = 0;
  std::vector<int64_t> valid_q, valid_kv;  // [b] rows / keys of each sequence in the tile
  int64_t numel() const { return batch * heads * rows * cols; }
};

TileDbias tile_dbias(const TileContext& ctx, const SideTables& q_tables,
                     const SideTables& kv_tables, int64_t local_heads) {
  TileDbias d;
  d.batch = ctx.geometry->batch;
  int64_t max_q = 0, max_kv = 0;
  for (int64_t b = 0; b < d.batch; ++b) {
    d.valid_q.push_back(q_tables.cu[size_t(b + 1)] - q_tables.cu[size_t(b)]);
    d.valid_kv.push_back(kv_tables.cu[size_t(b + 1)] - kv_tables.cu[size_t(b)]);
    max_q = std::max(max_q, d.valid_q.back());
    max_kv = std::max(max_kv, d.valid_kv.back());
  }
  // As the tile's problem sees it: max_seqlen = the longest sequence in the tile.
  d.heads = ctx.dbias.shape[1] == 1 ? 1 : local_heads;
  d.rows = ctx.dbias.shape[2] == 1 ? 1 : max_q;
  d.cols = max_kv;
  return d;
}

// The same on the device: the tile-local gradient `local` (a device set of d.numel() fp32)
// joins the unsharded device accumulator ctx.dbias at the tile's global positions.
void add_tile_dbias_on_device(const TileContext& ctx, const TileDbias& d, const Packed& local,
                              int q_chunk, int kv_chunk) {
  const Geometry& g = *ctx.geometry;
  const bool rows_broadcast = ctx.dbias.shape[2] == 1;
  std::vector<int64_t> sequences;  // per b: valid rows, valid keys, q position, kv position
  for (int64_t b = 0; b < d.batch; ++b) {
    sequences.push_back(rows_broadcast ? 1 : d.valid_q[size_t(b)]);
    sequences.push_back(d.valid_kv[size_t(b)]);
    sequences.push_back(g.q.position(b, q_chunk));
    sequences.push_back(g.kv.position(b, kv_chunk));
  }
  const size_t bytes = sequences.size() * sizeof(int64_t);
  const std::shared_ptr<void> table = allocate_device_bytes(bytes, ctx.sets);
  // A pageable-memory copy is staged before cudaMemcpyAsync returns: the host table may go.
  copy_bytes(table.get(), sequences.data(), bytes, ctx.sets);
  const BroadcastLayout layout = BroadcastLayout::of(ctx.dbias);
  const int64_t strides[4] = {layout.stride_batch, layout.stride_head, layout.stride_q,
                              layout.stride_kv};
  add_tile_bias_gradient_device(static_cast<float*>(ctx.dbias.data), strides,
                                static_cast<const float*>(local.data()), d.batch, d.heads, d.rows,
                                d.cols, static_cast<const int64_t*>(table.get()), ctx.head_offset,
                                ctx.sets);
}

// Builds the tile's problem (global positions, unsharded aux tensors), selects a backend that
// declares CP tiles and runs it; `args` are on the device the tiles run on.
BackendKind run_tile_forward(const TileContext& ctx, const AttentionConfig& config,
                             const ForwardArgs& args, int q_chunk, int kv_chunk) {
  AttentionProblem p = build_forward_problem(config, args, ctx.dropout, ctx.rng);
  set_tile_fields(ctx, q_chunk, kv_chunk, p);
  attach_aux(ctx, p);
  p.cp.exclude_sink = true;  // the sink joins once per row, after the merge
  const Backend& backend = choose_backend(config, p, *ctx.backends);
  backend.forward(p);
  return backend.capabilities().kind;
}

BackendKind run_tile_backward(const TileContext& ctx, const AttentionConfig& config,
                              const BackwardArgs& args, int q_chunk, int kv_chunk,
                              bool dbias_local = false) {
  AttentionProblem p = build_backward_problem(config, args, ctx.dropout);
  set_tile_fields(ctx, q_chunk, kv_chunk, p);
  attach_aux(ctx, p);
  p.cp.use_given_lse = true;
  p.cp.dbias_local = dbias_local && p.wants_dbias;
  const Backend& backend = choose_backend(config, p, *ctx.backends);
  backend.backward(p);
  return backend.capabilities().kind;
}

}  // namespace

bool tile_may_see(const TileContext& ctx, int q_chunk, int kv_chunk) {
  const Geometry& g = *ctx.geometry;
  constexpr int64_t kFar = std::numeric_limits<int64_t>::max() / 4;
  for (int64_t b = 0; b < g.batch; ++b) {
    const int64_t rows = g.q.valid(b, q_chunk), keys = g.kv.valid(b, kv_chunk);
    if (rows == 0 || keys == 0) continue;
    const int64_t first_row = g.q.position(b, q_chunk) + g.diagonal[size_t(b)];
    const int64_t lowest = g.window_left < 0 ? -kFar : first_row - g.window_left;
    const int64_t highest = g.window_right < 0 ? kFar : first_row + rows - 1 + g.window_right;
    const int64_t first_key = g.kv.position(b, kv_chunk);
    if (lowest <= first_key + keys - 1 && highest >= first_key) return true;
  }
  return false;
}

TileForwardOut tile_forward(const TileContext& ctx, ChunkRef q, ChunkRef k, ChunkRef v) {
  const Geometry& g = *ctx.geometry;
  const int64_t rows_q = g.q.rows_per_chunk, rows_kv = g.kv.rows_per_chunk;
  const int64_t local_heads = q.set->heads;
  SideTables q_tables = side_tables(g, g.q, q.chunk);
  SideTables kv_tables = side_tables(g, g.kv, k.chunk);
  HeadSlices slices = head_slices(ctx, local_heads);

  TileForwardOut out;
  out.o = Packed::alike(*q.set, q.set->dtype, rows_q, local_heads, v.set->dim);
  const bool resident = q.set->place.on_device();
  std::vector<float> lse(resident ? 0 : size_t(local_heads * rows_q));
  ForwardArgs args;
  args.in.q = q.set->view(q.slot * rows_q, rows_q);
  args.in.k = k.set->view(k.slot * rows_kv, rows_kv);
  args.in.v = v.set->view(v.slot * rows_kv, rows_kv);
  args.in.cu_seqlens_q = q_tables.cu_view();
  args.in.cu_seqlens_kv = kv_tables.cu_view();
  args.in.cu_seqlens_q_padded = q_tables.padded_view();
  args.in.cu_seqlens_kv_padded = kv_tables.padded_view();
  args.in.softmax_offset = slices.softmax_offset;
  args.in.alibi_slopes = slices.alibi_slopes;
  args.o = out.o.view(0, rows_q);
  args.lse = TensorView::contiguous(lse.data(), DType::kFloat32, {local_heads, rows_q});

  const AttentionConfig config = tile_config(ctx);
  if (resident) {  // the sets are the tile's tensors
    const Packed scratch(DType::kFloat32, local_heads, rows_q, 1, q.set->place);
    args.lse = heads_major_view(scratch, local_heads, rows_q);
    args.stream = q.set->place.stream;
    out.backend = run_tile_forward(ctx, config, args, q.chunk, k.chunk);
    out.lse = Packed::alike(*q.set, DType::kFloat32, rows_q, local_heads, 1);
    copy_lse_heads(static_cast<float*>(const_cast<void*>(scratch.data())), out.lse.f32_data(),
                   local_heads, rows_q, true, q.set->place);
    return out;
  }
  out.backend = run_tile_forward(ctx, config, args, q.chunk, k.chunk);
  out.lse = lse_from_heads_major(lse, local_heads, rows_q);
  return out;
}

TileBackwardOut tile_backward(const TileContext& ctx, const TileBackwardIn& in) {
  const Geometry& g = *ctx.geometry;
  const int64_t rows_q = g.q.rows_per_chunk, rows_kv = g.kv.rows_per_chunk;
  const int64_t local_heads = in.q.set->heads;
  SideTables q_tables = side_tables(g, g.q, in.q.chunk);
  SideTables kv_tables = side_tables(g, g.kv, in.k.chunk);
  HeadSlices slices = head_slices(ctx, local_heads);

  // The final LSE of the q chunk, heads-major as the backends store thd LSE.
  const bool resident = in.q.set->place.on_device();
  std::vector<float> lse(resident ? 0 : size_t(local_heads * rows_q));
  Packed lse_scratch;
  if (resident) {
    lse_scratch = Packed(DType::kFloat32, local_heads, rows_q, 1, in.q.set->place);
    copy_lse_heads(lse_scratch.f32_data(),
                   const_cast<Packed*>(in.lse)->f32_data() + in.q.slot * rows_q * local_heads,
                   local_heads, rows_q, false, in.q.set->place);
  } else {
    const float* packed_lse = in.lse->f32() + in.q.slot * rows_q * local_heads;
    for (int64_t r = 0; r < rows_q; ++r)
      for (int64_t h = 0; h < local_heads; ++h)
        lse[size_t(h * rows_q + r)] = packed_lse[r * local_heads + h];
  }

  TileBackwardOut out;
  out.dq = Packed::alike(*in.q.set, in.q.set->dtype, rows_q, local_heads, in.q.set->dim);
  out.dk = Packed::alike(*in.k.set, in.k.set->dtype, rows_kv, in.k.set->heads, in.k.set->dim);
  out.dv = Packed::alike(*in.v.set, in.v.set->dtype, rows_kv, in.v.set->heads, in.v.set->dim);
  BackwardArgs args;
  args.in.q = in.q.set->view(in.q.slot * rows_q, rows_q);
  args.in.k = in.k.set->view(in.k.slot * rows_kv, rows_kv);
  args.in.v = in.v.set->view(in.v.slot * rows_kv, rows_kv);
  args.in.cu_seqlens_q = q_tables.cu_view();
  args.in.cu_seqlens_kv = kv_tables.cu_view();
  args.in.cu_seqlens_q_padded = q_tables.padded_view();
  args.in.cu_seqlens_kv_padded = kv_tables.padded_view();
  args.in.softmax_offset = slices.softmax_offset;
  args.in.alibi_slopes = slices.alibi_slopes;
  args.o = in.o.set->view(in.o.slot * rows_q, rows_q);
  args.d_o = in.d_o.set->view(in.d_o.slot * rows_q, rows_q);
  args.lse = TensorView::contiguous(lse.data(), DType::kFloat32, {local_heads, rows_q});
  args.dq = out.dq.view(0, rows_q);
  args.dk = out.dk.view(0, rows_kv);
  args.dv = out.dv.view(0, rows_kv);
  args.rng = ctx.rng;

  const AttentionConfig config = tile_config(ctx);
  if (resident) {  // the sets are the tile's tensors
    args.lse = heads_major_view(lse_scratch, local_heads, rows_q);
    args.stream = in.q.set->place.stream;
    if (!ctx.dbias.defined()) {
      out.backend = run_tile_backward(ctx, config, args, in.q.chunk, in.k.chunk);
      return out;
    }
    // The GPU tiles write dbias tile-local; it joins the unsharded device accumulator at the
    // tile's global positions.
    const TileDbias local = tile_dbias(ctx, q_tables, kv_tables, local_heads);
    Packed local_values(DType::kFloat32, local.numel(), 1, 1, ctx.sets);
    fill(local_values, 0.0f);
    TileContext local_ctx = ctx;
    local_ctx.dbias =
        TensorView::contiguous(local_values.data(), DType::kFloat32,
                               {local.batch, local.heads, local.rows, local.cols}, Device::kCUDA);
    local_ctx.dbias.device_index = ctx.sets.index;
    out.backend = run_tile_backward(local_ctx, config, args, in.q.chunk, in.k.chunk, true);
    add_tile_dbias_on_device(ctx, local, local_values, in.q.chunk, in.k.chunk);
    return out;
  }
  out.backend = run_tile_backward(ctx, config, args, in.q.chunk, in.k.chunk);
  return out;
}

}  // namespace dpa::cp
