// The deterministic one-kernel backward's dq order (flash_tiles.h: chain_member_walk, dq_turn_vote,
// dq_turn), simulated on the host: every tile's adds happen in the documented order whatever
// the blocks' timing, nothing deadlocks, and a chain whose blocks run in step never waits.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/flash/flash_tiles.h"

namespace dpa::cuda {
namespace {

constexpr int kBlockN = 128, kBlockM = 64;

struct Problem {
  int seqlen_q, seqlen_kv, diagonal, window_left, window_right, group, chain;
};

QueryTileSpan tiles_of(const Problem& p, int key_block) {
  return key_block_query_tiles(key_block * kBlockN, kBlockN, kBlockM, p.seqlen_q, p.seqlen_kv,
                               p.diagonal, p.window_left, p.window_right);
}

int key_blocks_of(const Problem& p) { return (p.seqlen_kv + kBlockN - 1) / kBlockN; }

// A key block's walk as the kernel makes it; `rotate` false starts every walk at its first
// tile (what the order would be without the rotation, to show that the rotation matters).
DqWalk walk_of(const Problem& p, int key_block, bool rotate) {
  DqWalk walk = chain_member_walk([&](int n) { return tiles_of(p, n); }, key_block / p.chain,
                                  p.chain, key_block % p.chain);
  if (!rotate) walk.rotation = 0;
  return walk;
}

using Tile = std::pair<int, int>;  // (head in the group, query tile)
struct Add {
  Tile tile;
  DqTurn turn;
};
struct Block {
  int key_block, chain_index;
  std::vector<Add> adds;  // in the walk's order: add j at step j
};

// Each key block's adds and turns, computed as the kernel's producer does: the walk gives the
// tile of step j, the chain's members vote (a lane each on the GPU), dq_turn gives the flags.
std::vector<Block> make_blocks(const Problem& p, bool rotate = true) {
  std::vector<Block> blocks;
  for (int n = 0; n < key_blocks_of(p); ++n) {
    const int chain_index = n / p.chain, place = n % p.chain;
    const DqWalk walk = walk_of(p, n, rotate);
    const QueryTileSpan previous_chain = tiles_of(p, chain_index * p.chain - 1);
    Block block{n, chain_index, {}};
    for (int j = 0; j < p.group * walk.count; ++j) {
      const int head = j / walk.count;
      const int tile = rotated_tile(walk.first, walk.count, walk.rotation, j % walk.count);
      EXPECT_TRUE(walk.covers(tile));
      EXPECT_EQ(walk.step(head, tile), j) << "key block " << n;
      int rank = 0, adders = 0;
      for (int member = 0; member < p.chain; ++member) {
        const int m = chain_index * p.chain + member;
        const DqTurnVote vote = dq_turn_vote(walk_of(p, m, rotate), member, head, tile, j, place);
        rank += vote.before;
        adders += vote.adds;
      }
      const bool previous_chain_adds = previous_chain.first <= tile && tile <= previous_chain.last;
      block.adds.push_back(
          {{head, tile}, dq_turn(chain_index, p.chain, rank, adders, previous_chain_adds)});
    }
    blocks.push_back(block);
  }
  return blocks;
}

bool ready(const Add& add, const std::map<Tile, int>& flags) {
  if (add.turn.wait < 0) return true;
  const auto flag = flags.find(add.tile);
  return (flag == flags.end() ? 0 : flag->second) == add.turn.wait;
}

// Runs every block's adds in its own order, each time a ready add of a random block; returns
// the key blocks in the order they added to each tile, and whether every add ran (else a wait
// could never be met: a deadlock, or a turn nobody releases).
std::pair<bool, std::map<Tile, std::vector<int>>> run_in_any_order(const std::vector<Block>& blocks,
                                                                   std::mt19937& rng) {
  std::map<Tile, int> flags;
  std::map<Tile, std::vector<int>> order;
  std::vector<size_t> next(blocks.size(), 0);
  for (;;) {
    std::vector<size_t> runnable;
    for (size_t b = 0; b < blocks.size(); ++b)
      if (next[b] < blocks[b].adds.size() && ready(blocks[b].adds[next[b]], flags))
        runnable.push_back(b);
    if (runnable.empty()) break;
    const size_t b = runnable[std::uniform_int_distribution<size_t>(0, runnable.size() - 1)(rng)];
    const Add& add = blocks[b].adds[next[b]++];
    flags[add.tile] = add.turn.release;
    order[add.tile].push_back(blocks[b].key_block);
  }
  for (size_t b = 0; b < blocks.size(); ++b)
    if (next[b] != blocks[b].adds.size()) return {false, order};
  return {true, order};
}

// The documented order: by chain, then by the step at which the member adds the tile, then by
// place in the chain.
std::map<Tile, std::vector<int>> documented_order(const Problem& p) {
  std::map<Tile, std::vector<std::tuple<int, int, int>>> keyed;
  for (int n = 0; n < key_blocks_of(p); ++n) {
    const DqWalk walk = walk_of(p, n, true);
    for (int head = 0; head < p.group; ++head)
      for (int tile = walk.first; tile < walk.first + walk.count; ++tile)
        keyed[{head, tile}].emplace_back(n / p.chain, walk.step(head, tile), n);
  }
  std::map<Tile, std::vector<int>> order;
  for (auto& [tile, keys] : keyed) {
    std::sort(keys.begin(), keys.end());
    for (const auto& key : keys) order[tile].push_back(std::get<2>(key));
  }
  return order;
}

// Ticks spent waiting when each chain's blocks start together, after the previous chain's last
// add, and every add takes a tick; -1 when a chain cannot finish.
int waits_in_step(const std::vector<Block>& blocks) {
  std::map<Tile, int> flags;
  int waits = 0;
  for (int chain_index = 0;; ++chain_index) {
    std::vector<size_t> members, next;
    for (size_t b = 0; b < blocks.size(); ++b)
      if (blocks[b].chain_index == chain_index) members.push_back(b);
    if (members.empty()) return waits;
    next.assign(members.size(), 0);
    for (bool busy = true; busy;) {
      busy = false;
      bool progressed = false;
      std::vector<const Add*> done;
      for (size_t i = 0; i < members.size(); ++i) {
        const Block& block = blocks[members[i]];
        if (next[i] == block.adds.size()) continue;
        busy = true;
        if (ready(block.adds[next[i]], flags)) {
          done.push_back(&block.adds[next[i]++]);
          progressed = true;
        } else {
          ++waits;
        }
      }
      if (busy && !progressed) return -1;
      for (const Add* add : done) flags[add->tile] = add->turn.release;
    }
  }
}

// Random lengths, windows, diagonals, GQA groups and chain lengths: the adds to each tile run in
// the documented order however the blocks are timed (so the sum is the same bits every run),
// and they all run (nothing waits for a turn that never comes). The adders of a tile are
// contiguous key blocks, which the turns between chains rely on.
TEST(DeterministicDqOrder, IsTheDocumentedOrderWhateverTheTiming) {
  std::mt19937 rng(11);
  auto draw = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 600; ++trial) {
    Problem p{draw(1, 1500),
              draw(1, 2500),
              0,
              draw(0, 2) == 0 ? -1 : draw(0, 400),
              draw(0, 2) == 0 ? -1 : draw(0, 400),
              draw(1, 3),
              draw(0, 1) ? 16 : draw(1, 7)};
    p.diagonal = draw(-p.seqlen_q - 5, p.seqlen_kv + 5);
    for (int tile = 0; tile * kBlockM < p.seqlen_q; ++tile) {
      int first = -1, last = -1;
      for (int n = 0; n < key_blocks_of(p); ++n) {
        const QueryTileSpan span = tiles_of(p, n);
        if (span.first > tile || tile > span.last) continue;
        if (first < 0) first = n;
        EXPECT_EQ(last, first < n ? n - 1 : -1)
            << "trial " << trial << ": tile " << tile << "'s key blocks are not contiguous";
        last = n;
      }
    }
    const std::vector<Block> blocks = make_blocks(p);
    const auto expected = documented_order(p);
    for (int run = 0; run < 2; ++run) {
      const auto [finished, order] = run_in_any_order(blocks, rng);
      ASSERT_TRUE(finished) << "trial " << trial << ": some add never ran";
      ASSERT_EQ(order, expected) << "trial " << trial;
    }
  }
}

// The bench's shapes (s = 8192, chains of 16): in step, no block of a chain waits, with or
// without a causal mask (top-left or bottom-right) or a causal window, with GQA. Without the
// rotation the blocks of an unmasked chain queue up: each waits for the one before it on every
// tile, 15 * 16 / 2 ticks per chain.
TEST(DeterministicDqOrder, ChainsInStepDoNotWait) {
  const int s = 8192, chain = kDeterministicKeyChain;
  for (int group : {1, 8}) {
    const Problem no_mask{s, s, 0, -1, -1, group, chain};
    const Problem causal{s, s, 0, -1, 0, group, chain};
    const Problem bottom_right{s / 2, s, s / 2, -1, 0, group, chain};
    const Problem window_1024{s, s, 0, 1023, 0, group, chain};
    const Problem window_128{s, s, 0, 127, 0, group, chain};
    for (const Problem& p : {no_mask, causal, bottom_right, window_1024, window_128})
      EXPECT_EQ(waits_in_step(make_blocks(p)), 0)
          << "group " << group << ", sq " << p.seqlen_q << ", window " << p.window_left << ","
          << p.window_right;
    EXPECT_EQ(waits_in_step(make_blocks(no_mask, false)), (s / kBlockN / chain) * 15 * 16 / 2)
        << "group " << group;
  }
}

TEST(DeterministicDqOrder, GridCoordinatesVisitEveryKeyBlockOnceChainByChain) {
  const int heads_kv = 3, batch_count = 2, key_blocks = 37;
  for (int chain : {1, 5, kDeterministicKeyChain}) {
    const int chains = (key_blocks + chain - 1) / chain;
    std::map<std::tuple<int, int, int>, int64_t> seen;  // (batch, KV head, key block) -> x
    for (int64_t x = 0; x < int64_t(chain) * heads_kv * batch_count * chains; ++x) {
      const DeterministicKeyBlock c = deterministic_key_block(x, chain, heads_kv, batch_count);
      EXPECT_EQ(c.key_block, c.chain_index * chain + c.place);
      EXPECT_TRUE(seen.emplace(std::make_tuple(c.batch, c.kv_head, c.key_block), x).second);
    }
    EXPECT_EQ(seen.size(), size_t(heads_kv * batch_count * chains * chain));
    // Each chain's blocks are consecutive in the grid, after the chain before it.
    for (const auto& [key, x] : seen) {
      const auto [batch, kv_head, key_block] = key;
      if (key_block % chain != 0) {
        EXPECT_EQ(seen.at({batch, kv_head, key_block - 1}), x - 1);
      } else if (key_block > 0) {
        EXPECT_LT(seen.at({batch, kv_head, key_block - 1}), x);
      }
    }
  }
  EXPECT_EQ(deterministic_key_chain(132), kDeterministicKeyChain);
  EXPECT_EQ(deterministic_key_chain(8), 8);
  EXPECT_EQ(deterministic_key_chain(0), 1);
}

}  // namespace
}  // namespace dpa::cuda
