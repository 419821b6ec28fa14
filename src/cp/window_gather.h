// The window-aware all_gather: a rank fetches only the KV chunks its query chunks can see,
// each from its owner, and the backward returns their dK/dV to the owners.
#pragma once

#include <vector>

#include "cp/cp_layout.h"
#include "cp/cp_setup.h"
#include "cp/tile.h"

namespace dpa::cp {

// The chunks this rank needs, K and V each in one set (slot i holds chunks[i]). gather_needed
// returns once every transfer is posted: the own slots (this rank's chunks) are filled, the
// peer slots are being received; wait on `pending` (which also holds the sends of this rank's
// chunks to the peers that need them) before reading those.
struct GatheredKv {
  std::vector<int> chunks;
  std::vector<size_t> own_slots, peer_slots;
  Packed k, v;
  std::vector<CommHandle> pending;
};

GatheredKv gather_needed(Communicator& comm, const Plan& plan, const TileContext& ctx,
                         const Packed& k, const Packed& v);

// Returns the fetched chunks' fp32 dK/dV (`dk`, `dv`, slots as in `gathered`) to their owners;
// fills this rank's own two-slot accumulators.
void return_gradients(Communicator& comm, const Plan& plan, const TileContext& ctx,
                      const GatheredKv& gathered, Packed& dk, Packed& dv, Packed& dk_own,
                      Packed& dv_own);

}  // namespace dpa::cp
