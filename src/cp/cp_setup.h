// A CP call's validation and geometry: the rank plan (ring, a2a groups, all_gather), the
// unsharded geometry of both sides, and what every tile of the call shares (TileContext).
#pragma once

#include <vector>

#include "cp/cp_layout.h"
#include "cp/tile.h"
#include "dpa/cp.h"

namespace dpa::cp {

struct Plan {
  int cp = 1, rank = 0;
  int a2a = 1;  // head-sharding group size
  int group = 0, member = 0;
  bool all_gather = false;
  std::vector<int> group_ranks, ring_ranks;
  int64_t heads_q = 0, heads_kv = 0;  // unsharded H, G
  int64_t kv_replication = 1;         // G' / G when KV heads are replicated for a2a

  int ring_size() const { return int(ring_ranks.size()); }
  // The rank of member `m` of a2a group (ring position) `g`.
  int rank_of(int g, int m) const { return g * a2a + m; }
  int64_t local_heads() const { return heads_q / a2a; }
  // The chunks held by a2a group `g`, in the order the group all-to-all stacks them.
  std::vector<int> group_chunks(int g) const {
    std::vector<int> chunks;
    for (int d = 0; d < a2a; ++d)
      for (int c : rank_chunks(cp, g * a2a + d)) chunks.push_back(c);
    return chunks;
  }
};

struct Setup {
  Geometry geometry;
  Plan plan;
};

// Validates the call's config, CP config, communicator and inputs (errors name the argument)
// and derives the plan and the geometry.
Setup setup(const AttentionConfig& config, const CpConfig& cp, const Communicator& comm,
            const AttentionInputs& in);

// A host tensor shaped like the local shard `like` with a contiguous last dim of `dim` (the
// local outputs and gradients); errors name it.
void require_like(const TensorView& t, const TensorView& like, int64_t dim, const char* name);

TileContext tile_context(const AttentionConfig& config, const Setup& s, const AttentionInputs& in,
                         double dropout, const RngState& rng);

}  // namespace dpa::cp
