// Tiled backward of the CPU backend (FlashAttention-2 style: P is recomputed from the saved
// LSE, nothing O(s^2) is stored except the fp32 dbias accumulator when dbias is requested).
//
// Determinism: every output element is owned by exactly one task, and each task sums its
// contributions in a fixed order, so results are bit-identical for any thread count.
//  - Rows pass, one task per (batch b, query head h, tile of kTileQ query rows): D_i = dO_i . o_i
//    for its rows, and a partial dalpha_h. The partials are summed serially afterwards in task
//    order.
//  - Then one of two plans (fused_backward_applies):
//    - Fused, one task per (batch b, KV head g): for each key tile in order, dk and dv of its
//      rows and the tile's share of dq = dU K for every query row of the group's heads, added
//      into an fp32 accumulator the task owns. Five products per pair of tiles.
//    - Two passes, for more and smaller tasks: a dq pass, one task per query tile, over the key
//      tiles in order, then a dk/dv pass, one task per (b, g, tile of kTileKv key rows). The
//      scores and dP are then computed twice: seven products per pair of tiles.
//    Both add each dq element's terms in the same order (keys ascending, the same products),
//    so they give the same bits for finite inputs (docs/cpu_backend.md;
//    tests/cpu/test_cpu_tiled.cc).
//  - dk and dv are summed over the H/G query heads of group g and all query rows. dbias is
//    accumulated there too (in fp32, converted once at the end). When dbias broadcasts over the
//    batch or the heads, tasks for different b (or g) would add into the same dbias element, so
//    those loops move inside a key task (a task then covers every b, or every g, of its key
//    tile), and only the two-pass plan is used.
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

// The fp32 accumulator for dbias, shaped [nb, nh, nsq, nkv] where a dimension the bias
// broadcasts over has extent 1.
struct BiasGradAccumulator {
  int64_t batches = 1, heads = 1, rows = 1, cols = 0;
  std::vector<float> values;

  int64_t index(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t bb = batches == 1 ? 0 : b, hh = heads == 1 ? 0 : h, ii = rows == 1 ? 0 : i;
    return ((bb * heads + hh) * rows + ii) * cols + j;
  }
};

// The dbias accumulator's batch and head extents: 1 where dbias broadcasts over that dimension.
// A CP tile's sequences sit at different global rows, so they stay apart even when dbias
// broadcasts over the batch (write_bias_grad then adds each at its own position).
int64_t dbias_batches(const AttentionProblem& p) {
  return p.dbias_layout.stride_batch != 0 || p.cp.aux_global ? p.batch : 1;
}
int64_t dbias_heads(const AttentionProblem& p) {
  return p.dbias_layout.stride_head != 0 ? p.heads_q : 1;
}
// Whether tasks of different batches (KV heads) would add into the same dbias elements, so one
// key task must cover them all.
bool dbias_folds_batches(const AttentionProblem& p) {
  return p.wants_dbias && dbias_batches(p) == 1 && p.batch > 1;
}
bool dbias_folds_groups(const AttentionProblem& p) {
  return p.wants_dbias && dbias_heads(p) == 1 && p.heads_kv > 1;
}

struct BackwardState {
  const AttentionProblem& p;
  LogitTransform transform;
  float scale;               // the true scale (not divided by the layer number)
  const float* lse;          // the saved LSE, [b, H, sq] or [H, tq]
  std::vector<float> delta;  // D_i, laid out like lse
  bool dbias = false;
  bool dbias_pre = false;  // dBpre = scale * dU; else dBpost = dS
  BiasGradAccumulator bias_grad;

  explicit BackwardState(const AttentionProblem& problem)
      : p(problem),
        transform(problem),
        scale(float(problem.scale)),
        lse(static_cast<const float*>(problem.lse.data)),
        delta(size_t(problem.lse.numel()), 0.0f) {}
};

// One tile of the backward recurrence for rows i0.. (of head h) and key columns j0.. .
// Inputs: q [rows, dqk], d_o [rows, dv], k_t [dqk, cols], v_t [dv, cols], and the rows' lse,
// D and visible ranges. Outputs, all [rows, cols]: pd = P * keep / keep_prob, ds = dS,
// du = dU (= dS without a softcap). Rows with LSE = -inf (nothing visible, no sink) give zeros.
struct TileGrad {
  std::vector<float> pd, ds, du, keep;
  TileGrad() : pd(size_t(kTileQ * kTileKv)), ds(pd.size()), du(pd.size()), keep(kTileKv) {}
};

void tile_gradients(const BackwardState& st, int64_t b, int64_t h, int64_t i0, int64_t rows,
                    const KeyRange* ranges, int64_t j0, int64_t cols, const float* q,
                    const float* d_o, const float* k_t, const float* v_t, const float* lse,
                    const float* delta, TileGrad& out) {
  const AttentionProblem& p = st.p;
  const bool softcap = st.transform.has_softcap();
  float* s = out.pd.data();
  float* dp = out.ds.data();
  float* t = out.du.data();
  matmul_transposed(q, k_t, rows, cols, p.head_dim_qk, s);
  matmul_transposed(d_o, v_t, rows, cols, p.head_dim_v, dp);
  st.transform.apply(b, h, i0, rows, ranges, j0, cols, s, softcap ? t : nullptr);

  for (int64_t r = 0; r < rows; ++r) {
    float* s_row = s + r * cols;
    float* dp_row = dp + r * cols;
    float* t_row = t + r * cols;
    if (lse[r] == kNegativeInfinity) {
      std::fill(s_row, s_row + cols, 0.0f);
      std::fill(dp_row, dp_row + cols, 0.0f);
      std::fill(t_row, t_row + cols, 0.0f);
      continue;
    }
    if (p.dropout_threshold != 0) {
      dropout_multipliers(p, b, h, i0 + r, j0, cols, out.keep.data());
    }
    const float row_delta = delta[r];
    exp_of_shifted(s_row, cols, lse[r]);  // P: 0 for masked pairs (s = -inf)
    for (int64_t c = 0; c < cols; ++c) {
      const float prob = s_row[c];
      const float keep = p.dropout_threshold != 0 ? out.keep[size_t(c)] : 1.0f;
      // Masked pairs give exactly 0, even when dO . v is not finite (rows outside a sequence).
      const float grad_score = prob == 0.0f ? 0.0f : prob * (dp_row[c] * keep - row_delta);
      s_row[c] = prob * keep;
      dp_row[c] = grad_score;
      // dU = dS * (1 - t^2); t is 0 for masked pairs, so -inf never meets it.
      t_row[c] = softcap ? grad_score * (1.0f - t_row[c] * t_row[c]) : grad_score;
    }
  }
}

struct QueryTile {
  int64_t batch, head, row0, rows;
};

// The rows pass of one query tile: D (into st.delta) and the tile's partial dalpha.
double query_tile_rows(BackwardState& st, const QueryTile& tile) {
  const AttentionProblem& p = st.p;
  const int64_t b = tile.batch, h = tile.head, i0 = tile.row0, rows = tile.rows;
  const int64_t dv = p.head_dim_v;
  std::vector<float> d_o(size_t(rows * dv)), o(size_t(rows * dv));  // [rows, dv]
  gather_rows(p.d_o, p.do_rows, b, i0, rows, h, dv, d_o.data());
  gather_rows(p.o, p.o_rows, b, i0, rows, h, dv, o.data());
  double dalpha = 0.0;
  const double sigma = sink_logit(p, h);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    const float lse = st.lse[p.lse_offset(b, h, i)];
    // Rows without a visible key (padded rows included) take no part in any gradient.
    if (visible_keys(p, b, i).empty() || lse == kNegativeInfinity) continue;
    double dot = 0.0;
    for (int64_t c = 0; c < dv; ++c) dot += double(d_o[size_t(r * dv + c)]) * o[size_t(r * dv + c)];
    st.delta[size_t(p.lse_offset(b, h, i))] = float(dot);
    if (p.wants_dsoftmax_offset) dalpha -= std::exp(sigma - double(lse)) * dot;
  }
  return dalpha;
}

// The two-pass plan's dq of one query tile, over the key tiles in order.
void query_tile_dq(const BackwardState& st, const QueryTile& tile) {
  const AttentionProblem& p = st.p;
  const int64_t b = tile.batch, h = tile.head, i0 = tile.row0, rows = tile.rows;
  const int64_t g = p.kv_head(h);
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v;

  std::vector<KeyRange> ranges(static_cast<size_t>(rows));
  std::vector<float> lse(static_cast<size_t>(rows)), delta(size_t(rows), 0.0f);
  int64_t keys_begin = std::numeric_limits<int64_t>::max(), keys_end = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    KeyRange range = visible_keys(p, b, i);
    lse[size_t(r)] = st.lse[p.lse_offset(b, h, i)];
    if (range.empty() || lse[size_t(r)] == kNegativeInfinity) range = {0, 0};
    ranges[size_t(r)] = range;
    if (range.empty()) continue;
    delta[size_t(r)] = st.delta[size_t(p.lse_offset(b, h, i))];
    keys_begin = std::min(keys_begin, range.begin);
    keys_end = std::max(keys_end, range.end);
  }

  std::vector<float> dq(size_t(rows * dqk), 0.0f);  // [rows, dqk]
  if (keys_begin < keys_end) {
    std::vector<float> q(size_t(rows * dqk)), d_o(size_t(rows * dv));  // [rows, dqk], [rows, dv]
    std::vector<float> k(size_t(kTileKv * dqk));                       // [cols, dqk]
    std::vector<float> k_t(size_t(kTileKv * dqk));                     // [dqk, cols]
    std::vector<float> v(size_t(kTileKv * dv));                        // [cols, dv]
    std::vector<float> v_t(size_t(kTileKv * dv));                      // [dv, cols]
    TileGrad grad;
    gather_rows(p.q, p.q_rows, b, i0, rows, h, dqk, q.data());
    gather_rows(p.d_o, p.do_rows, b, i0, rows, h, dv, d_o.data());
    for (int64_t j0 = keys_begin; j0 < keys_end; j0 += kTileKv) {
      const int64_t cols = std::min(kTileKv, keys_end - j0);
      gather_rows(p.k, p.k_rows, b, j0, cols, g, dqk, k.data());
      transpose(k.data(), cols, dqk, k_t.data());
      gather_rows(p.v, p.v_rows, b, j0, cols, g, dv, v.data());
      transpose(v.data(), cols, dv, v_t.data());
      tile_gradients(st, b, h, i0, rows, ranges.data(), j0, cols, q.data(), d_o.data(), k_t.data(),
                     v_t.data(), lse.data(), delta.data(), grad);
      accumulate_product(grad.du.data(), k.data(), rows, cols, dqk, dq.data());
    }
    for (float& value : dq) value *= st.scale;
  }
  scatter_rows(p.dq, p.dq_rows, b, i0, rows, h, dqk, dq.data());
}

// The two-pass plan's key task: key rows [j0, j0 + kTileKv) of batches [b_begin, b_end) and KV
// heads [g_begin, g_end).
struct KeyTask {
  int64_t b_begin, b_end, g_begin, g_end, j0;
};

// Accumulates dk (unscaled) and dv of live key rows [j0, j0 + cols) into dk [cols, dqk] and
// dv_acc [cols, dv], summed over the heads of group g and every query row that sees them. When
// dq_group is not null (the fused plan) it also adds these keys' share of dq (unscaled) into
// dq_group [group heads, q_extent(b), dqk], the group's accumulator.
void accumulate_key_tile(BackwardState& st, int64_t b, int64_t g, int64_t j0, int64_t cols,
                         float* dk, float* dv_acc, float* dq_group) {
  const AttentionProblem& p = st.p;
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v;
  std::vector<float> k(size_t(cols * dqk)), k_t(size_t(cols * dqk));  // [cols, dqk], [dqk, cols]
  std::vector<float> v(size_t(cols * dv)), v_t(size_t(cols * dv));    // [cols, dv], [dv, cols]
  gather_rows(p.k, p.k_rows, b, j0, cols, g, dqk, k.data());
  transpose(k.data(), cols, dqk, k_t.data());
  gather_rows(p.v, p.v_rows, b, j0, cols, g, dv, v.data());
  transpose(v.data(), cols, dv, v_t.data());

  std::vector<KeyRange> ranges(static_cast<size_t>(kTileQ));
  std::vector<float> lse(static_cast<size_t>(kTileQ)), delta(static_cast<size_t>(kTileQ));
  std::vector<float> q(size_t(kTileQ * dqk)), d_o(size_t(kTileQ * dv));
  TileGrad grad;
  const int64_t extent = q_extent(p, b);
  const int64_t group = p.group_size();
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t tile_begin = 0; tile_begin < extent; tile_begin += kTileQ) {
      // The rows of this query tile that see a key of this key tile, trimmed to [first, last].
      const int64_t tile_end = std::min(tile_begin + kTileQ, extent);
      int64_t first = -1, last = -1;
      for (int64_t i = tile_begin; i < tile_end; ++i) {
        const KeyRange range = visible_keys(p, b, i);
        if (range.empty() || range.end <= j0 || range.begin >= j0 + cols) continue;
        if (st.lse[p.lse_offset(b, h, i)] == kNegativeInfinity) continue;
        if (first < 0) first = i;
        last = i;
      }
      if (first < 0) continue;
      const int64_t rows = last - first + 1;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = first + r;
        lse[size_t(r)] = st.lse[p.lse_offset(b, h, i)];
        delta[size_t(r)] = st.delta[size_t(p.lse_offset(b, h, i))];
        ranges[size_t(r)] = visible_keys(p, b, i);
        if (lse[size_t(r)] == kNegativeInfinity) ranges[size_t(r)] = {0, 0};
      }
      gather_rows(p.q, p.q_rows, b, first, rows, h, dqk, q.data());
      gather_rows(p.d_o, p.do_rows, b, first, rows, h, dv, d_o.data());
      tile_gradients(st, b, h, first, rows, ranges.data(), j0, cols, q.data(), d_o.data(),
                     k_t.data(), v_t.data(), lse.data(), delta.data(), grad);
      accumulate_transposed_product(grad.pd.data(), d_o.data(), rows, cols, dv, dv_acc);
      accumulate_transposed_product(grad.du.data(), q.data(), rows, cols, dqk, dk);
      if (dq_group != nullptr) {
        float* dq_rows = dq_group + ((h - g * group) * extent + first) * dqk;
        accumulate_product(grad.du.data(), k.data(), rows, cols, dqk, dq_rows);
      }
      if (st.dbias) {
        // This task owns dbias columns [j0, j0 + cols) of its (b, h) (or of every b / h that
        // the bias broadcasts over, see the file comment).
        const float* source = st.dbias_pre ? grad.du.data() : grad.ds.data();
        const float factor = st.dbias_pre ? st.scale : 1.0f;
        for (int64_t r = 0; r < rows; ++r) {
          float* target = st.bias_grad.values.data() + st.bias_grad.index(b, h, first + r, j0);
          for (int64_t c = 0; c < cols; ++c) target[c] += factor * source[r * cols + c];
        }
      }
    }
  }
}

// Key rows [j0, j0 + rows) of KV head g of batch b: dk, dv (and dbias columns, and dq_group's
// terms: accumulate_key_tile). Rows past the sequence's own length (bshd padding) are written as
// zeros and never read.
void key_tile_backward(BackwardState& st, int64_t b, int64_t g, int64_t j0, int64_t rows_out,
                       float* dq_group) {
  const AttentionProblem& p = st.p;
  const int64_t dqk = p.head_dim_qk, dv = p.head_dim_v;
  // [rows_out, dqk] and [rows_out, dv]; the first `cols` rows are the live keys.
  std::vector<float> dk(size_t(rows_out * dqk), 0.0f), dv_acc(size_t(rows_out * dv), 0.0f);
  const int64_t cols = std::clamp<int64_t>(p.seqlen_kv[b] - j0, 0, rows_out);
  if (cols > 0) {
    accumulate_key_tile(st, b, g, j0, cols, dk.data(), dv_acc.data(), dq_group);
    for (float& value : dk) value *= st.scale;
  }
  scatter_rows(p.dk, p.dk_rows, b, j0, rows_out, g, dqk, dk.data());
  scatter_rows(p.dv, p.dv_rows, b, j0, rows_out, g, dv, dv_acc.data());
}

// The fused plan's task: every key tile of KV head g of batch b in order, then dq of the
// group's query heads.
void key_head_backward(BackwardState& st, int64_t b, int64_t g) {
  const AttentionProblem& p = st.p;
  const int64_t dqk = p.head_dim_qk, group = p.group_size();
  const int64_t q_rows = q_extent(p, b), kv_rows = kv_extent(p, b);
  std::vector<float> dq_group(size_t(group * q_rows * dqk), 0.0f);
  for (int64_t j0 = 0; j0 < kv_rows; j0 += kTileKv) {
    key_tile_backward(st, b, g, j0, std::min(kTileKv, kv_rows - j0), dq_group.data());
  }
  for (float& value : dq_group) value *= st.scale;
  for (int64_t n = 0; n < group; ++n) {
    scatter_rows(p.dq, p.dq_rows, b, 0, q_rows, g * group + n, dqk,
                 dq_group.data() + n * q_rows * dqk);
  }
}

void write_bias_grad(const AttentionProblem& p, const BiasGradAccumulator& acc) {
  const BroadcastLayout& layout = p.dbias_layout;
  if (p.cp.aux_global) {
    // A CP tile adds its share to the unsharded fp32 dbias at its global positions. Serial:
    // with a broadcast batch dim several of the tile's sequences add to the same elements.
    for (int64_t b = 0; b < acc.batches; ++b)
      for (int64_t h = 0; h < acc.heads; ++h)
        for (int64_t i = 0; i < acc.rows; ++i) {
          const float* row = acc.values.data() + acc.index(b, h, i, 0);
          for (int64_t j = 0; j < acc.cols; ++j) {
            const int64_t at = p.aux_offset(layout, b, h, i, j);
            store(p.dbias, at, load(p.dbias, at) + row[j]);
          }
        }
    return;
  }
  parallel_for(acc.batches * acc.heads, [&](int64_t index) {
    const int64_t b = index / acc.heads, h = index % acc.heads;
    for (int64_t i = 0; i < acc.rows; ++i) {
      const float* row = acc.values.data() + acc.index(b, h, i, 0);
      const int64_t start = layout.offset(b, h, i, 0);
      if (layout.stride_kv == 1) {
        store_row_f32(p.dbias.data, p.dbias.dtype, start, acc.cols, row);
      } else {
        for (int64_t j = 0; j < acc.cols; ++j) {
          store(p.dbias, start + j * layout.stride_kv, row[j]);
        }
      }
    }
  });
}

}  // namespace

bool fused_backward_applies(const AttentionProblem& p, int threads) {
  if (dbias_folds_batches(p) || dbias_folds_groups(p)) return false;
  const int64_t tasks = p.batch * p.heads_kv, workers = std::max(threads, 1);
  int64_t longest_q = 0;
  for (int64_t b = 0; b < p.batch; ++b) longest_q = std::max(longest_q, q_extent(p, b));
  const int64_t accumulator_bytes = p.group_size() * longest_q * p.head_dim_qk * 4;
  if (std::min(tasks, workers) * accumulator_bytes > kFusedAccumulatorBytes) return false;
  // Per pair of tiles the fused plan runs 5 products to the two passes' 7, in fewer tasks: fused
  // when ceil(tasks / workers) rounds of 5 take no longer than tasks / workers rounds of 7.
  const int64_t rounds = (tasks + workers - 1) / workers;
  return 5 * workers * rounds <= 7 * tasks;
}

void tiled_backward(const AttentionProblem& p) {
  BackwardState st(p);

  if (p.format == Format::kTHD) {
    // Rows between padded sequences belong to no sequence: their gradients are 0.
    zero_packed_rows(p.dq, p.dq_rows, thd_gap_rows(p.total_q, p.seq_start_q, p.seqlen_q), p.heads_q,
                     p.head_dim_qk);
    const std::vector<int64_t> kv_gaps = thd_gap_rows(p.total_kv, p.seq_start_kv, p.seqlen_kv);
    zero_packed_rows(p.dk, p.dk_rows, kv_gaps, p.heads_kv, p.head_dim_qk);
    zero_packed_rows(p.dv, p.dv_rows, kv_gaps, p.heads_kv, p.head_dim_v);
  }

  // D and the dalpha partials, one task per query tile.
  std::vector<QueryTile> query_tiles;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t extent = q_extent(p, b);
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t i0 = 0; i0 < extent; i0 += kTileQ) {
        query_tiles.push_back({b, h, i0, std::min(kTileQ, extent - i0)});
      }
    }
  }
  std::vector<double> dalpha_partial(query_tiles.size(), 0.0);
  parallel_for(int64_t(query_tiles.size()), [&](int64_t index) {
    dalpha_partial[size_t(index)] = query_tile_rows(st, query_tiles[size_t(index)]);
  });
  if (p.wants_dsoftmax_offset) {
    std::vector<double> dalpha(size_t(p.heads_q), 0.0);
    for (size_t index = 0; index < query_tiles.size(); ++index) {
      dalpha[size_t(query_tiles[index].head)] += dalpha_partial[index];
    }
    for (int64_t h = 0; h < p.heads_q; ++h) store(p.dsoftmax_offset, h, dalpha[size_t(h)]);
  }

  if (p.wants_dbias) {
    st.dbias = true;
    st.dbias_pre = p.bias_type == BiasType::kPreScale;
    BiasGradAccumulator& acc = st.bias_grad;
    acc.batches = dbias_batches(p);
    acc.heads = dbias_heads(p);
    acc.rows = p.dbias_layout.stride_q != 0 ? p.max_seqlen_q : 1;
    acc.cols = p.max_seqlen_kv;
    acc.values.assign(size_t(acc.batches * acc.heads * acc.rows * acc.cols), 0.0f);
  }

  if (fused_backward_applies(p, num_threads())) {
    parallel_for(p.batch * p.heads_kv, [&](int64_t index) {
      key_head_backward(st, index / p.heads_kv, index % p.heads_kv);
    });
  } else {
    parallel_for(int64_t(query_tiles.size()),
                 [&](int64_t index) { query_tile_dq(st, query_tiles[size_t(index)]); });
    std::vector<KeyTask> key_tasks;
    const int64_t batch_step = dbias_folds_batches(p) ? p.batch : 1;
    const int64_t group_step = dbias_folds_groups(p) ? p.heads_kv : 1;
    for (int64_t b = 0; b < p.batch; b += batch_step) {
      int64_t extent = 0;
      for (int64_t bb = b; bb < b + batch_step; ++bb) extent = std::max(extent, kv_extent(p, bb));
      for (int64_t g = 0; g < p.heads_kv; g += group_step) {
        for (int64_t j0 = 0; j0 < extent; j0 += kTileKv) {
          key_tasks.push_back({b, b + batch_step, g, g + group_step, j0});
        }
      }
    }
    parallel_for(int64_t(key_tasks.size()), [&](int64_t index) {
      const KeyTask& task = key_tasks[size_t(index)];
      for (int64_t b = task.b_begin; b < task.b_end; ++b) {
        const int64_t cols = std::min(kTileKv, kv_extent(p, b) - task.j0);
        if (cols <= 0) continue;
        for (int64_t g = task.g_begin; g < task.g_end; ++g)
          key_tile_backward(st, b, g, task.j0, cols, nullptr);
      }
    });
  }
  if (st.dbias) write_bias_grad(p, st.bias_grad);
}

}  // namespace dpa::cpu
