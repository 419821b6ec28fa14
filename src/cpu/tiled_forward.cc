// Tiled forward of the CPU backend: one task per (batch, query head, tile of kTileQ query rows),
// each an online softmax over key tiles of kTileKv columns (FlashAttention's recurrence, in
// fp32). A task owns its rows of o and lse, so tasks never share an output element and the
// result does not depend on the number of threads.
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

struct QueryTile {
  int64_t batch, head, row0, rows;
};

std::vector<QueryTile> query_tiles(const AttentionProblem& p) {
  std::vector<QueryTile> tiles;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t extent = q_extent(p, b);
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t i0 = 0; i0 < extent; i0 += kTileQ) {
        tiles.push_back({b, h, i0, std::min(kTileQ, extent - i0)});
      }
    }
  }
  return tiles;
}

void forward_tile(const AttentionProblem& p, const LogitTransform& transform,
                  const QueryTile& tile) {
  const int64_t b = tile.batch, h = tile.head, i0 = tile.row0, rows = tile.rows;
  const int64_t g = p.kv_head(h);
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v;

  std::vector<KeyRange> ranges(static_cast<size_t>(rows));
  int64_t keys_begin = std::numeric_limits<int64_t>::max(), keys_end = 0;
  for (int64_t r = 0; r < rows; ++r) {
    ranges[size_t(r)] = visible_keys(p, b, i0 + r);
    if (ranges[size_t(r)].empty()) continue;
    keys_begin = std::min(keys_begin, ranges[size_t(r)].begin);
    keys_end = std::max(keys_end, ranges[size_t(r)].end);
  }

  std::vector<float> acc(size_t(rows * dv), 0.0f);              // [rows, dv] unnormalised o
  std::vector<float> row_max(size_t(rows), kNegativeInfinity);  // running max m_i
  std::vector<float> row_sum(size_t(rows), 0.0f);               // running sum, relative to m_i
  if (keys_begin < keys_end) {
    std::vector<float> q(size_t(rows * dqk));               // [rows, dqk]
    std::vector<float> k(size_t(kTileKv * dqk));            // [cols, dqk]
    std::vector<float> k_t(size_t(kTileKv * dqk));          // [dqk, cols]
    std::vector<float> v(size_t(kTileKv * dv));             // [cols, dv]
    std::vector<float> scores(size_t(rows * kTileKv));      // [rows, cols]
    std::vector<float> keep(static_cast<size_t>(kTileKv));  // [cols]
    gather_rows(p.q, p.q_rows, b, i0, rows, h, dqk, q.data());

    for (int64_t j0 = keys_begin; j0 < keys_end; j0 += kTileKv) {
      const int64_t cols = std::min(kTileKv, keys_end - j0);
      gather_rows(p.k, p.k_rows, b, j0, cols, g, dqk, k.data());
      transpose(k.data(), cols, dqk, k_t.data());
      gather_rows(p.v, p.v_rows, b, j0, cols, g, dv, v.data());
      matmul_transposed(q.data(), k_t.data(), rows, cols, dqk, scores.data());
      transform.apply(b, h, i0, rows, ranges.data(), j0, cols, scores.data(), nullptr);

      for (int64_t r = 0; r < rows; ++r) {
        float* s = scores.data() + r * cols;
        // A NaN logit must reach o and lse instead of reading as a masked key
        // (docs/decisions.md, non-finite inputs): the maxima keep NaN.
        const float new_max = keep_nan_max(row_max[size_t(r)], max_keeping_nan(s, cols));
        if (new_max == kNegativeInfinity) {  // nothing visible yet: P = 0
          for (int64_t c = 0; c < cols; ++c) s[c] = 0.0f;
          continue;
        }
        exp_of_shifted(s, cols, new_max);
        const float tile_sum = sum_in_lanes(s, cols);
        // Dropout scales P in o only; the normaliser Z sums the undropped P.
        if (p.dropout_threshold != 0) {
          dropout_multipliers(p, b, h, i0 + r, j0, cols, keep.data());
          for (int64_t c = 0; c < cols; ++c) s[c] *= keep[size_t(c)];
        }
        const float correction = std::exp(row_max[size_t(r)] - new_max);  // 0 from -inf
        row_sum[size_t(r)] = row_sum[size_t(r)] * correction + tile_sum;
        if (correction != 1.0f) {
          float* o = acc.data() + r * dv;
          for (int64_t c = 0; c < dv; ++c) o[c] *= correction;
        }
        row_max[size_t(r)] = new_max;
      }
      accumulate_product(scores.data(), v.data(), rows, cols, dv, acc.data());
    }
  }

  // The sink enters the max and the normaliser once, after all keys (it has no value row).
  const float sigma = float(sink_logit(p, h));
  float* lse = static_cast<float*>(p.lse.data);
  for (int64_t r = 0; r < rows; ++r) {
    float* o = acc.data() + r * dv;
    const float final_max = keep_nan_max(row_max[size_t(r)], sigma);
    if (final_max == kNegativeInfinity) {  // no visible key and no sink
      std::fill(o, o + dv, 0.0f);
      lse[p.lse_offset(b, h, i0 + r)] = kNegativeInfinity;
      continue;
    }
    const float rescale = std::exp(row_max[size_t(r)] - final_max);
    const float normaliser = row_sum[size_t(r)] * rescale + std::exp(sigma - final_max);
    const float factor = rescale / normaliser;
    for (int64_t c = 0; c < dv; ++c) o[c] *= factor;
    lse[p.lse_offset(b, h, i0 + r)] = final_max + std::log(normaliser);
  }
  scatter_rows(p.o, p.o_rows, b, i0, rows, h, dv, acc.data());
}

}  // namespace

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
  const std::vector<QueryTile> tiles = query_tiles(p);
  parallel_for(int64_t(tiles.size()),
               [&](int64_t index) { forward_tile(p, transform, tiles[size_t(index)]); });
}

}  // namespace dpa::cpu
