// cpu_exact: the fp64 oracle. Plain loops that follow DESIGN.md §3-4 line by line; clarity
// over speed. Every other backend is tested against this file.
//
// One concession to speed: the loops over heads run as thread-pool tasks (the GPU suite and
// CI spend most of their time here). Each output element belongs to one task, which computes
// it in the order the plain loops would, so results are bit-identical for any thread count.
// The forward's tasks are (batch, query head) pairs; the backward's are KV heads, whose query
// heads' dq and dalpha and whose dk and dv no other task touches (one task when dbias is
// wanted: a broadcast dbias sums over heads).
#include <cmath>
#include <limits>
#include <vector>

#include "core/attention_math.h"
#include "core/row_iteration.h"
#include "cpu/cpu_backends.h"
#include "cpu/thread_pool.h"

namespace dpa {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// One query row's softmax over its visible keys, in fp64.
struct RowSoftmax {
  std::vector<int64_t> keys;   // visible key positions j
  std::vector<double> tanh_t;  // t_ij = tanh(u_ij / c) (softcap only)
  std::vector<double> logits;  // s_ij
  std::vector<double> probs;   // P_ij (without dropout)
  double lse = kNegInf;
};

double dot(const TensorView& a, int64_t a_offset, const TensorView& b, int64_t b_offset,
           int64_t width) {
  double sum = 0.0;
  for (int64_t c = 0; c < width; ++c) sum += load(a, a_offset + c) * load(b, b_offset + c);
  return sum;
}

RowSoftmax row_softmax(const AttentionProblem& p, int64_t b, int64_t h, int64_t i) {
  RowSoftmax row;
  const int64_t g = p.kv_head(h);
  const int64_t q_offset = p.q_rows.offset(b, i, h);
  std::vector<double>& logits = row.logits;
  KeyRange range = visible_keys(p, b, i);
  for (int64_t j = range.begin; j < range.end; ++j) {
    if (masked_by_tensor(p, b, h, i, j)) continue;
    double qk = dot(p.q, q_offset, p.k, p.k_rows.offset(b, j, g), p.head_dim_qk);
    double u = p.scale * (qk + pre_scale_bias(p, b, h, i, j));
    double s = u;
    if (p.softcap > 0) {
      double t = std::tanh(u / p.softcap);
      row.tanh_t.push_back(t);
      s = p.softcap * t;
    }
    s += post_cap_bias(p, b, h, i, j);
    row.keys.push_back(j);
    logits.push_back(s);
  }
  // The non-finite contract (docs/decisions.md): a NaN logit makes the whole row NaN (P, o,
  // lse), as on the GPU; -inf logits are masked keys; a row with only those (and no sink) is an
  // empty row, o = 0 and lse = -inf. A +inf logit gives NaN through exp(inf - inf).
  const double sigma = sink_logit(p, h);
  for (double s : logits)
    if (std::isnan(s)) {
      row.probs.assign(logits.size(), std::numeric_limits<double>::quiet_NaN());
      row.lse = std::numeric_limits<double>::quiet_NaN();
      return row;
    }
  double m = sigma;
  for (double s : logits) m = std::max(m, s);
  if (m == kNegInf) {  // no visible key with a finite logit, and no sink
    row.probs.assign(logits.size(), 0.0);
    return row;
  }
  double z = std::exp(sigma - m);  // exp(-inf) = 0 without a sink
  for (double s : logits) z += std::exp(s - m);
  for (double s : logits) row.probs.push_back(std::exp(s - m) / z);
  row.lse = m + std::log(z);
  return row;
}

class CpuExactBackend final : public Backend {
 public:
  CpuExactBackend() {
    caps_ = full_feature_capabilities(BackendKind::kCpuExact, Device::kCPU);
    caps_.dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64};
    caps_.cp_tiles = true;
    caps_.extra_rules.push_back(refuse_tile_local_dbias);
  }

  const Capabilities& capabilities() const override { return caps_; }

  void forward(const AttentionProblem& p) const override {
    zero_rows(p, p.o, p.o_rows, true, p.heads_q, p.head_dim_v);
    fill_lse_empty(p);
    float* lse = static_cast<float*>(p.lse.data);
    cpu::parallel_for(p.batch * p.heads_q, [&](int64_t task) {
      const int64_t b = task / p.heads_q, h = task % p.heads_q;
      for (int64_t i = 0; i < p.seqlen_q[b]; ++i) {
        RowSoftmax row = row_softmax(p, b, h, i);
        lse[p.lse_offset(b, h, i)] = float(row.lse);
        const int64_t g = p.kv_head(h);
        const int64_t o_offset = p.o_rows.offset(b, i, h);
        for (int64_t c = 0; c < p.head_dim_v; ++c) {
          double sum = 0.0;
          for (size_t n = 0; n < row.keys.size(); ++n) {
            const int64_t j = row.keys[n];
            double weight = row.probs[n] * dropout_scale(p, b, h, i, j);
            sum += weight * load(p.v, p.v_rows.offset(b, j, g) + c);
          }
          store(p.o, o_offset + c, sum);
        }
      }
    });
  }

  void backward(const AttentionProblem& p) const override {
    // fp64 accumulators for dk, dv (indexed by stored kv row, KV head, channel), dbias and
    // dalpha; written to the outputs once at the end.
    const int64_t kv_rows = p.format == Format::kTHD ? p.total_kv : p.batch * p.max_seqlen_kv;
    auto kv_index = [&](int64_t b, int64_t j) {
      return p.format == Format::kTHD ? p.seq_start_kv[b] + j : b * p.max_seqlen_kv + j;
    };
    std::vector<double> dk(size_t(kv_rows * p.heads_kv * p.head_dim_qk), 0.0);
    std::vector<double> dv(size_t(kv_rows * p.heads_kv * p.head_dim_v), 0.0);
    std::vector<double> dbias(p.wants_dbias ? size_t(p.dbias.numel()) : 0, 0.0);
    std::vector<double> dalpha(size_t(p.heads_q), 0.0);

    zero_rows(p, p.dq, p.dq_rows, true, p.heads_q, p.head_dim_qk);
    // Query row i of head h: its dq, and its shares of dk, dv, dbias and dalpha.
    auto backward_row = [&](int64_t b, int64_t h, int64_t i, std::vector<double>& dq_row) {
      RowSoftmax row = row_softmax(p, b, h, i);
      if (p.cp.use_given_lse) {
        // A CP tile: P from the final (merged, sink-included) LSE of the whole row.
        row.lse = load(p.lse, p.lse_offset(b, h, i));
        row.probs.assign(row.keys.size(), 0.0);
        for (size_t n = 0; n < row.keys.size(); ++n)
          row.probs[n] = row.lse == kNegInf ? 0.0 : std::exp(row.logits[n] - row.lse);
      }
      const int64_t g = p.kv_head(h);
      const int64_t do_offset = p.do_rows.offset(b, i, h);
      const int64_t q_offset = p.q_rows.offset(b, i, h);
      const double d_row = dot(p.d_o, do_offset, p.o, p.o_rows.offset(b, i, h), p.head_dim_v);
      if (p.softmax_type == SoftmaxType::kLearnable && row.lse != kNegInf)
        dalpha[size_t(h)] -= std::exp(sink_logit(p, h) - row.lse) * d_row;
      std::fill(dq_row.begin(), dq_row.end(), 0.0);
      for (size_t n = 0; n < row.keys.size(); ++n) {
        const int64_t j = row.keys[n];
        const double keep_scale = dropout_scale(p, b, h, i, j);
        const int64_t k_offset = p.k_rows.offset(b, j, g);
        const int64_t v_offset = p.v_rows.offset(b, j, g);
        const double dp = dot(p.d_o, do_offset, p.v, v_offset, p.head_dim_v) * keep_scale;
        const double ds = row.probs[n] * (dp - d_row);
        const double du = p.softcap > 0 ? ds * (1.0 - row.tanh_t[n] * row.tanh_t[n]) : ds;
        double* dk_row = &dk[size_t((kv_index(b, j) * p.heads_kv + g) * p.head_dim_qk)];
        double* dv_row = &dv[size_t((kv_index(b, j) * p.heads_kv + g) * p.head_dim_v)];
        for (int64_t c = 0; c < p.head_dim_qk; ++c) {
          dq_row[size_t(c)] += p.scale * du * load(p.k, k_offset + c);
          dk_row[c] += p.scale * du * load(p.q, q_offset + c);
        }
        const double pd = row.probs[n] * keep_scale;
        for (int64_t c = 0; c < p.head_dim_v; ++c) dv_row[c] += pd * load(p.d_o, do_offset + c);
        if (p.wants_dbias) {
          double grad = p.bias_type == BiasType::kPreScale ? p.scale * du : ds;
          dbias[size_t(p.aux_offset(p.dbias_layout, b, h, i, j))] += grad;
        }
      }
      const int64_t dq_offset = p.dq_rows.offset(b, i, h);
      for (int64_t c = 0; c < p.head_dim_qk; ++c) store(p.dq, dq_offset + c, dq_row[size_t(c)]);
    };
    const int64_t tasks = p.wants_dbias ? 1 : p.heads_kv;
    cpu::parallel_for(tasks, [&](int64_t task) {
      std::vector<double> dq_row(size_t(p.head_dim_qk));
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t h = 0; h < p.heads_q; ++h)
          if (tasks == 1 || p.kv_head(h) == task)
            for (int64_t i = 0; i < p.seqlen_q[b]; ++i) backward_row(b, h, i, dq_row);
    });

    zero_rows(p, p.dk, p.dk_rows, false, p.heads_kv, p.head_dim_qk);
    zero_rows(p, p.dv, p.dv_rows, false, p.heads_kv, p.head_dim_v);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t j = 0; j < p.seqlen_kv[b]; ++j)
        for (int64_t g = 0; g < p.heads_kv; ++g) {
          const size_t row = size_t(kv_index(b, j) * p.heads_kv + g);
          for (int64_t c = 0; c < p.head_dim_qk; ++c)
            store(p.dk, p.dk_rows.offset(b, j, g) + c, dk[row * p.head_dim_qk + c]);
          for (int64_t c = 0; c < p.head_dim_v; ++c)
            store(p.dv, p.dv_rows.offset(b, j, g) + c, dv[row * p.head_dim_v + c]);
        }
    if (p.wants_dbias)  // a CP tile adds its share to the unsharded dbias
      for (int64_t n = 0; n < p.dbias.numel(); ++n)
        store(p.dbias, n, (p.cp.aux_global ? load(p.dbias, n) : 0.0) + dbias[size_t(n)]);
    if (p.wants_dsoftmax_offset)
      for (int64_t h = 0; h < p.heads_q; ++h) store(p.dsoftmax_offset, h, dalpha[size_t(h)]);
  }

 private:
  Capabilities caps_;
};

}  // namespace

const Backend& cpu_exact_backend() {
  static const CpuExactBackend backend;
  return backend;
}

}  // namespace dpa
