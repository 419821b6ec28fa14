// One CP tile: attention of one query chunk (slot of a Packed set) on one key chunk, with rows
// and keys at their unsharded positions, run by a backend that declares Capabilities::cp_tiles.
// The forward returns the partial (o, LSE) over the tile's keys WITHOUT the sink; the backward
// takes the final o and LSE and returns partial dq, dk, dv.
#pragma once

#include "core/backend.h"
#include "cp/cp_layout.h"

namespace dpa::cp {

// What every tile of one CP call shares.
struct TileContext {
  AttentionConfig config;  // the caller's config (format is replaced by thd for tiles)
  const Geometry* geometry = nullptr;
  TensorView softmax_offset;  // fp32 [H] (learnable), full
  TensorView alibi_slopes;    // fp32 [H] or [b, H], full
  // Unsharded [b|1, H|1, Sq|1, Skv|1] tensors read (and dbias, fp32, accumulated) at the
  // tiles' global positions (AttentionProblem::cp.aux_global).
  BiasType bias_type = BiasType::kNoBias;
  TensorView bias, attn_mask, dbias;
  int64_t heads_total = 0;  // H
  int64_t head_offset = 0;  // global index of local head 0
  double dropout = 0.0;
  RngState rng;
  // The backends a tile chooses from (the registry, or a test's).
  const std::vector<const Backend*>* backends = &registered_backends();
  // Where the tiles run: with host chunk sets on the host (the tensors above host tensors);
  // with device sets on the sets themselves, on their stream (the tensors above device
  // tensors of the sets' device).
  Placement sets;
};

// A chunk slot of a Packed set and the global chunk index it holds.
struct ChunkRef {
  const Packed* set = nullptr;
  int64_t slot = 0;
  int chunk = 0;
};

// Whether any (row, key) of the chunk pair can be visible under the window (a cheap, exact
// skip test: each row's window is one interval and consecutive rows' intervals overlap).
bool tile_may_see(const TileContext& ctx, int q_chunk, int kv_chunk);

struct TileForwardOut {
  Packed o;    // [rows_per_chunk_q, Hl, dv], storage dtype
  Packed lse;  // fp32 [rows_per_chunk_q, Hl, 1]
  BackendKind backend = BackendKind::kAuto;
};
TileForwardOut tile_forward(const TileContext& ctx, ChunkRef q, ChunkRef k, ChunkRef v);

struct TileBackwardIn {
  ChunkRef q, k, v, o, d_o;     // o, d_o: slots of the q side's sets (final o)
  const Packed* lse = nullptr;  // fp32 [rows, Hl, 1] final LSE of the q set
};
struct TileBackwardOut {
  Packed dq, dk, dv;  // storage dtype, rows of one chunk
  BackendKind backend = BackendKind::kAuto;
};
TileBackwardOut tile_backward(const TileContext& ctx, const TileBackwardIn& in);

}  // namespace dpa::cp
