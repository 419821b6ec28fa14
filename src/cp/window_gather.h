// The window-aware all_gather: a rank fetches only the KV chunks its query chunks can see,
// each from its owner, and the backward returns their dK/dV to the owners. p2p under a narrow
// window runs on it too.
#pragma once

#include <vector>

#include "cp/cp_exchange.h"
#include "cp/cp_layout.h"
#include "cp/cp_setup.h"
#include "cp/tile.h"

namespace dpa::cp {

// The chunks this rank needs, K and V each in one set (slot i holds chunks[i]). gather_needed
// returns once every transfer is posted: the own slots (this rank's chunks) are filled, the
// peer slots are being received; settle `pending` (which also holds the sends of this rank's
// chunks to the peers that need them; Transfers) before reading those.
struct GatheredKv {
  std::vector<int> chunks;
  std::vector<size_t> own_slots, peer_slots;
  Packed k, v;
  std::vector<CommHandle> pending;
};

// Whether a p2p call runs on the window-aware gather instead of the ring (setup() decides it
// once, for the forward and the backward alike): without a2a, when a window leaves every rank
// at most four peers' chunks to see (the neighbours of its two chunks: a window narrower than a
// chunk), fewer than the 2cp - 2 the ring brings it (so never at cp = 2, nor without a window).
// The ring carries KV one way, and in the dual-chunk layout a rank's chunks r and 2cp - 1 - r
// border the chunks of both ring neighbours (steps 1 and cp - 1): a narrow window still needs
// every step of the ring, while the gather moves only the chunks it sees. It holds more at
// once: up to 8 chunks of K and V (the local 2 and a gathered set of 6) against the ring's 4,
// and in the backward up to 12 chunks of fp32 dK and dV against the ring's 4
// (docs/context_parallel.md gives the bytes). Every rank derives it from the global geometry,
// so all agree.
bool p2p_takes_window_gather(const Plan& plan, const TileContext& ctx);
// Turns a p2p plan into the gather's (one ring position: this rank).
void take_window_gather(Plan& plan);

GatheredKv gather_needed(Communicator& comm, const Plan& plan, const TileContext& ctx,
                         const Packed& k, const Packed& v);

// The fetched chunks' fp32 dK/dV on their way back to their owners, and this rank's own chunks'
// dK/dV on their way in from the peers that fetched them.
struct ReturningGradients {
  struct Incoming {
    int64_t slot;  // of the rank's own two-slot accumulators
    Packed dk, dv;
  };
  std::vector<Incoming> incoming;  // peers by rank, chunks ascending: a fixed order
  std::vector<CommHandle> pending;
};

// Posts the returns of the peer slots of `dk`, `dv` (slots as in `gathered`; those slots are
// final, the own ones may still be accumulated into) and the receives of this rank's chunks'
// gradients, so that tiles of the own slots run while they travel.
ReturningGradients start_returning_gradients(Communicator& comm, const Plan& plan,
                                             const TileContext& ctx, const GatheredKv& gathered,
                                             const Packed& dk, const Packed& dv);

// Settles them (Transfers), then fills this rank's two-slot accumulators: its own slots of
// `dk`, `dv` first, then the peers' contributions.
void finish_returning_gradients(ReturningGradients& returning, const Plan& plan,
                                const GatheredKv& gathered, const Packed& dk, const Packed& dv,
                                Packed& dk_own, Packed& dv_own, Transfers& transfers);

}  // namespace dpa::cp
