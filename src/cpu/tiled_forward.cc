// Tiled forward of the CPU backend: one task per (batch, tile of kTileQ query rows, run of query
// heads of one KV head), each an online softmax over key tiles of kTileKv columns
// (FlashAttention's recurrence, in fp32). A task gathers each key tile once for all its heads
// (forward_heads_per_task). It owns its rows of o and lse, so tasks never share an output
// element, and each row's arithmetic is the same whatever the task holds: the result does not
// depend on the number of threads.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/thread_pool.h"
#include "cpu/tiled_common.h"
#include "cpu/tiled_passes.h"

namespace dpa::cpu {
namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// Query heads head0 .. head0 + heads - 1 (one KV head's) of rows row0 .. row0 + rows - 1.
struct QueryTile {
  int64_t batch, head0, heads, row0, rows;
};

std::vector<QueryTile> query_tiles(const AttentionProblem& p, int64_t heads_per_task) {
  std::vector<QueryTile> tiles;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t extent = q_extent(p, b);
    for (int64_t h = 0; h < p.heads_q; h += heads_per_task) {
      for (int64_t i0 = 0; i0 < extent; i0 += kTileQ) {
        tiles.push_back({b, h, heads_per_task, i0, std::min(kTileQ, extent - i0)});
      }
    }
  }
  return tiles;
}

// One query head's state in a task: its rows of q, the unnormalised o, the running max and sum.
struct HeadRows {
  std::vector<float> q, acc, row_max, row_sum;
};

// The online-softmax step of one head's rows over one key tile: scores [rows, cols] becomes P
// (times the dropout multipliers), the head's max, sum and o are updated.
void softmax_step(const AttentionProblem& p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                  int64_t j0, int64_t cols, float* scores, float* keep, HeadRows& head) {
  const int64_t dv = p.head_dim_v;
  for (int64_t r = 0; r < rows; ++r) {
    float* s = scores + r * cols;
    // A NaN logit must reach o and lse instead of reading as a masked key
    // (docs/decisions.md, non-finite inputs): the maxima keep NaN.
    const float new_max = keep_nan_max(head.row_max[size_t(r)], max_keeping_nan(s, cols));
    if (new_max == kNegativeInfinity) {  // nothing visible yet: P = 0
      for (int64_t c = 0; c < cols; ++c) s[c] = 0.0f;
      continue;
    }
    exp_of_shifted(s, cols, new_max);
    const float tile_sum = sum_in_lanes(s, cols);
    // Dropout scales P in o only; the normaliser Z sums the undropped P.
    if (p.dropout_threshold != 0) {
      dropout_multipliers(p, b, h, i0 + r, j0, cols, keep);
      for (int64_t c = 0; c < cols; ++c) s[c] *= keep[c];
    }
    const float correction = std::exp(head.row_max[size_t(r)] - new_max);  // 0 from -inf
    head.row_sum[size_t(r)] = head.row_sum[size_t(r)] * correction + tile_sum;
    if (correction != 1.0f) {
      float* o = head.acc.data() + r * dv;
      for (int64_t c = 0; c < dv; ++c) o[c] *= correction;
    }
    head.row_max[size_t(r)] = new_max;
  }
}

// The sink, the normalisation and the stores of one head's rows of o and lse.
void finish_head(const AttentionProblem& p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                 HeadRows& head) {
  const int64_t dv = p.head_dim_v;
  // The sink enters the max and the normaliser once, after all keys (it has no value row).
  const float sigma = float(sink_logit(p, h));
  float* lse = static_cast<float*>(p.lse.data);
  for (int64_t r = 0; r < rows; ++r) {
    float* o = head.acc.data() + r * dv;
    const float final_max = keep_nan_max(head.row_max[size_t(r)], sigma);
    if (final_max == kNegativeInfinity) {  // no visible key and no sink
      std::fill(o, o + dv, 0.0f);
      lse[p.lse_offset(b, h, i0 + r)] = kNegativeInfinity;
      continue;
    }
    const float rescale = std::exp(head.row_max[size_t(r)] - final_max);
    const float normaliser = head.row_sum[size_t(r)] * rescale + std::exp(sigma - final_max);
    const float factor = rescale / normaliser;
    for (int64_t c = 0; c < dv; ++c) o[c] *= factor;
    lse[p.lse_offset(b, h, i0 + r)] = final_max + std::log(normaliser);
  }
  scatter_rows(p.o, p.o_rows, b, i0, rows, h, dv, head.acc.data());
}

void forward_tile(const AttentionProblem& p, const LogitTransform& transform,
                  const QueryTile& tile) {
  const int64_t b = tile.batch, i0 = tile.row0, rows = tile.rows;
  const int64_t g = p.kv_head(tile.head0);
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v;

  std::vector<KeyRange> ranges(static_cast<size_t>(rows));
  int64_t keys_begin = std::numeric_limits<int64_t>::max(), keys_end = 0;
  for (int64_t r = 0; r < rows; ++r) {
    ranges[size_t(r)] = visible_keys(p, b, i0 + r);
    if (ranges[size_t(r)].empty()) continue;
    keys_begin = std::min(keys_begin, ranges[size_t(r)].begin);
    keys_end = std::max(keys_end, ranges[size_t(r)].end);
  }

  std::vector<HeadRows> heads(size_t(tile.heads));
  for (HeadRows& head : heads) {
    head.acc.assign(size_t(rows * dv), 0.0f);
    head.row_max.assign(size_t(rows), kNegativeInfinity);
    head.row_sum.assign(size_t(rows), 0.0f);
  }
  if (keys_begin < keys_end) {
    std::vector<float> k(size_t(kTileKv * dqk));            // [cols, dqk]
    std::vector<float> k_t(size_t(kTileKv * dqk));          // [dqk, cols]
    std::vector<float> v(size_t(kTileKv * dv));             // [cols, dv]
    std::vector<float> scores(size_t(rows * kTileKv));      // [rows, cols]
    std::vector<float> keep(static_cast<size_t>(kTileKv));  // [cols]
    for (int64_t e = 0; e < tile.heads; ++e) {
      heads[size_t(e)].q.resize(size_t(rows * dqk));  // [rows, dqk]
      gather_rows(p.q, p.q_rows, b, i0, rows, tile.head0 + e, dqk, heads[size_t(e)].q.data());
    }

    for (int64_t j0 = keys_begin; j0 < keys_end; j0 += kTileKv) {
      const int64_t cols = std::min(kTileKv, keys_end - j0);
      gather_rows(p.k, p.k_rows, b, j0, cols, g, dqk, k.data());
      transpose(k.data(), cols, dqk, k_t.data());
      gather_rows(p.v, p.v_rows, b, j0, cols, g, dv, v.data());
      for (int64_t e = 0; e < tile.heads; ++e) {
        const int64_t h = tile.head0 + e;
        HeadRows& head = heads[size_t(e)];
        matmul_transposed(head.q.data(), k_t.data(), rows, cols, dqk, scores.data());
        transform.apply(b, h, i0, rows, ranges.data(), j0, cols, scores.data(), nullptr);
        softmax_step(p, b, h, i0, rows, j0, cols, scores.data(), keep.data(), head);
        accumulate_product(scores.data(), v.data(), rows, cols, dv, head.acc.data());
      }
    }
  }
  for (int64_t e = 0; e < tile.heads; ++e)
    finish_head(p, b, tile.head0 + e, i0, rows, heads[size_t(e)]);
}

}  // namespace

int64_t forward_heads_per_task(const AttentionProblem& p, int threads) {
  int64_t query_tiles = 0;
  for (int64_t b = 0; b < p.batch; ++b) query_tiles += (q_extent(p, b) + kTileQ - 1) / kTileQ;
  // More heads per task gather each key tile for more of them; fewer make more tasks. The most
  // heads that still leave kForwardTasksPerThread tasks per thread (a causal mask makes tasks
  // unequal, and smaller ones even out between threads).
  const int64_t wanted = kForwardTasksPerThread * std::max(threads, 1);
  const int64_t group = p.group_size();
  for (int64_t heads = group; heads > 1; --heads) {
    if (group % heads == 0 && query_tiles * p.heads_kv * (group / heads) >= wanted) return heads;
  }
  return 1;
}

void tiled_forward(const AttentionProblem& p) {
  if (p.format == Format::kTHD) {
    // Rows between padded sequences belong to no sequence: o = 0, lse = the empty-row value.
    const std::vector<int64_t> gaps = thd_gap_rows(p.total_q, p.seq_start_q, p.seqlen_q);
    zero_packed_rows(p.o, p.o_rows, gaps, p.heads_q, p.head_dim_v);
    float* lse = static_cast<float*>(p.lse.data);
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t row : gaps) lse[h * p.total_q + row] = empty_row_lse(p, h);
    }
  }
  const LogitTransform transform(p);
  const std::vector<QueryTile> tiles = query_tiles(p, forward_heads_per_task(p, num_threads()));
  parallel_for(int64_t(tiles.size()),
               [&](int64_t index) { forward_tile(p, transform, tiles[size_t(index)]); });
}

}  // namespace dpa::cpu
