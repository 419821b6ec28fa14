// Tiled forward of the CPU backend: one task per (batch, query head, tile of kTileQ query rows),
// each an online softmax over key tiles of kTileKv columns (FlashAttention's recurrence, in
// fp32). A task owns its rows of o and lse, so tasks never share an output element and the
// result does not depend on the number of threads. K (transposed) and V of each (batch, KV
// head) are converted to fp32 once, before the query tiles that read them, instead of by every
// query tile: in rounds of (batch, KV head) pairs whose copies fit kConvertedKeyValueBytes.
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

// The fp32 copies of one (batch, KV head): k_t [dqk, rows] (K transposed) and v [rows, dv].
struct KeyValueRows {
  int64_t rows = 0;
  std::vector<float> k_t, v;
};

constexpr int64_t kConvertedKeyValueBytes = int64_t(256) << 20;

int64_t converted_bytes(const AttentionProblem& p, int64_t b) {
  return kv_extent(p, b) * (p.head_dim_qk + p.head_dim_v) * int64_t(sizeof(float));
}

void convert_key_value_rows(const AttentionProblem& p, int64_t b, int64_t g, KeyValueRows& out) {
  out.rows = kv_extent(p, b);
  std::vector<float> k(size_t(out.rows * p.head_dim_qk));
  gather_rows(p.k, p.k_rows, b, 0, out.rows, g, p.head_dim_qk, k.data());
  out.k_t.resize(k.size());
  transpose(k.data(), out.rows, p.head_dim_qk, out.k_t.data());
  out.v.resize(size_t(out.rows * p.head_dim_v));
  gather_rows(p.v, p.v_rows, b, 0, out.rows, g, p.head_dim_v, out.v.data());
}

// The query tiles of the heads that read KV head g of batch b.
void append_query_tiles(const AttentionProblem& p, int64_t b, int64_t g,
                        std::vector<QueryTile>& tiles) {
  const int64_t extent = q_extent(p, b), group = p.group_size();
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t i0 = 0; i0 < extent; i0 += kTileQ) {
      tiles.push_back({b, h, i0, std::min(kTileQ, extent - i0)});
    }
  }
}

void forward_tile(const AttentionProblem& p, const LogitTransform& transform,
                  const KeyValueRows& kv, const QueryTile& tile) {
  const int64_t b = tile.batch, h = tile.head, i0 = tile.row0, rows = tile.rows;
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
    std::vector<float> scores(size_t(rows * kTileKv));      // [rows, cols]
    std::vector<float> keep(static_cast<size_t>(kTileKv));  // [cols]
    gather_rows(p.q, p.q_rows, b, i0, rows, h, dqk, q.data());

    for (int64_t j0 = keys_begin; j0 < keys_end; j0 += kTileKv) {
      const int64_t cols = std::min(kTileKv, keys_end - j0);
      matmul_transposed(q.data(), kv.k_t.data() + j0, kv.rows, rows, cols, dqk, scores.data());
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
      accumulate_product(scores.data(), kv.v.data() + j0 * dv, rows, cols, dv, acc.data());
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
  const int64_t pairs = p.batch * p.heads_kv;
  std::vector<KeyValueRows> kv(static_cast<size_t>(pairs));  // indexed b * G + g
  for (int64_t first = 0; first < pairs;) {
    // A round: the pairs from `first` whose copies fit the budget (at least one).
    int64_t end = first + 1, bytes = converted_bytes(p, first / p.heads_kv);
    while (end < pairs && bytes + converted_bytes(p, end / p.heads_kv) <= kConvertedKeyValueBytes) {
      bytes += converted_bytes(p, end / p.heads_kv);
      ++end;
    }
    parallel_for(end - first, [&](int64_t n) {
      const int64_t pair = first + n;
      convert_key_value_rows(p, pair / p.heads_kv, pair % p.heads_kv, kv[size_t(pair)]);
    });
    std::vector<QueryTile> tiles;
    for (int64_t pair = first; pair < end; ++pair)
      append_query_tiles(p, pair / p.heads_kv, pair % p.heads_kv, tiles);
    parallel_for(int64_t(tiles.size()), [&](int64_t index) {
      const QueryTile& tile = tiles[size_t(index)];
      const KeyValueRows& rows = kv[size_t(tile.batch * p.heads_kv + p.kv_head(tile.head))];
      forward_tile(p, transform, rows, tile);
    });
    for (int64_t pair = first; pair < end; ++pair) kv[size_t(pair)] = KeyValueRows();
    first = end;
  }
}

}  // namespace dpa::cpu
