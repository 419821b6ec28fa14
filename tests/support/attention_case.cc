#include "support/attention_case.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace dpa::test {
namespace {

std::vector<int64_t> qkv_shape(Format format, int64_t batch, int64_t seq, int64_t heads,
                               int64_t dim) {
  if (format == Format::kBSHD) return {batch, seq, heads, dim};
  if (format == Format::kSBHD) return {seq, batch, heads, dim};
  return {seq, heads, dim};
}

HostTensor cumulative(const std::vector<int32_t>& lengths, const std::vector<int32_t>* gaps) {
  HostTensor cu(DType::kInt32, {int64_t(lengths.size()) + 1});
  int64_t total = 0;
  cu.set(0, 0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    total += lengths[i] + (gaps && i < gaps->size() ? (*gaps)[i] : 0);
    cu.set(int64_t(i) + 1, double(total));
  }
  return cu;
}

int64_t total_rows(const std::vector<int32_t>& lengths, const std::vector<int32_t>& gaps) {
  int64_t total = 0;
  for (size_t i = 0; i < lengths.size(); ++i) total += lengths[i] + (i < gaps.size() ? gaps[i] : 0);
  return total;
}

int64_t longest(const std::vector<int32_t>& lengths) {
  int64_t best = 0;
  for (int32_t length : lengths) best = std::max<int64_t>(best, length);
  return best;
}

}  // namespace

AttentionInputs CaseTensors::inputs() const {
  AttentionInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  if (cu_seqlens_q.defined()) in.cu_seqlens_q = cu_seqlens_q.view();
  if (cu_seqlens_kv.defined()) in.cu_seqlens_kv = cu_seqlens_kv.view();
  if (cu_seqlens_q_padded.defined()) in.cu_seqlens_q_padded = cu_seqlens_q_padded.view();
  if (cu_seqlens_kv_padded.defined()) in.cu_seqlens_kv_padded = cu_seqlens_kv_padded.view();
  if (bias.defined()) in.bias = bias.view();
  if (alibi_slopes.defined()) in.alibi_slopes = alibi_slopes.view();
  if (softmax_offset.defined()) in.softmax_offset = softmax_offset.view();
  if (attn_mask.defined()) in.attn_mask = attn_mask.view();
  return in;
}

CaseTensors make_case(const CaseSpec& spec) {
  std::mt19937_64 rng(spec.seed);
  CaseTensors t;
  const Format format = spec.config.format;
  const bool thd = format == Format::kTHD;
  int64_t rows_q = spec.seqlen_q, rows_kv = spec.seqlen_kv;
  int64_t max_q = spec.seqlen_q, max_kv = spec.seqlen_kv;
  int64_t batch = spec.batch;
  if (thd) {
    batch = int64_t(spec.lengths_q.size());
    rows_q = total_rows(spec.lengths_q, spec.gaps_q);
    rows_kv = total_rows(spec.lengths_kv, spec.gaps_kv);
    max_q = longest(spec.lengths_q);
    max_kv = longest(spec.lengths_kv);
    t.cu_seqlens_q = cumulative(spec.lengths_q, nullptr);
    t.cu_seqlens_kv = cumulative(spec.lengths_kv, nullptr);
    if (!spec.gaps_q.empty()) t.cu_seqlens_q_padded = cumulative(spec.lengths_q, &spec.gaps_q);
    if (!spec.gaps_kv.empty()) t.cu_seqlens_kv_padded = cumulative(spec.lengths_kv, &spec.gaps_kv);
  } else {
    if (!spec.lengths_q.empty()) t.cu_seqlens_q = cumulative(spec.lengths_q, nullptr);
    if (!spec.lengths_kv.empty()) t.cu_seqlens_kv = cumulative(spec.lengths_kv, nullptr);
  }
  t.q = HostTensor::randn(spec.dtype,
                          qkv_shape(format, batch, rows_q, spec.heads_q, spec.head_dim_qk), rng,
                          spec.qk_stddev);
  t.k = HostTensor::randn(spec.dtype,
                          qkv_shape(format, batch, rows_kv, spec.heads_kv, spec.head_dim_qk), rng,
                          spec.qk_stddev);
  t.v = HostTensor::randn(spec.dtype,
                          qkv_shape(format, batch, rows_kv, spec.heads_kv, spec.head_dim_v), rng);
  t.d_o = HostTensor::randn(spec.dtype,
                            qkv_shape(format, batch, rows_q, spec.heads_q, spec.head_dim_v), rng);
  if (spec.config.bias_type != BiasType::kNoBias) {
    std::vector<int64_t> shape = spec.bias_shape;
    if (shape.empty()) shape = {batch, spec.heads_q, max_q, max_kv};
    t.bias = HostTensor::randn(spec.dtype, shape, rng);
  }
  if (spec.alibi) {
    std::vector<int64_t> shape = spec.alibi_per_batch ? std::vector<int64_t>{batch, spec.heads_q}
                                                      : std::vector<int64_t>{spec.heads_q};
    t.alibi_slopes = HostTensor(DType::kFloat32, shape);
    std::uniform_real_distribution<double> slope(0.05, 1.0);
    for (int64_t i = 0; i < t.alibi_slopes.numel(); ++i) t.alibi_slopes.set(i, slope(rng));
  }
  if (spec.config.softmax_type == SoftmaxType::kLearnable)
    t.softmax_offset =
        HostTensor::randn(DType::kFloat32, {spec.heads_q}, rng, spec.sink_stddev, spec.sink_mean);
  if (spec.config.mask_type == MaskType::kArbitrary) {
    t.attn_mask = HostTensor(DType::kBool, {batch, spec.heads_q, max_q, max_kv});
    std::bernoulli_distribution masked(spec.mask_density);
    for (int64_t i = 0; i < t.attn_mask.numel(); ++i) t.attn_mask.set(i, masked(rng) ? 1 : 0);
  }
  return t;
}

int64_t poison_rows_past_sequences(const CaseSpec& spec, CaseTensors& t) {
  const Format format = spec.config.format;
  // sbhd is not taken here; bshd without lengths has no such rows.
  if (format != Format::kBSHD && format != Format::kTHD) return 0;
  if (spec.lengths_kv.empty()) return 0;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<bool> used;  // per flattened row: (b * rows + r) for bshd, r for thd
  int64_t rows = 0;
  if (format == Format::kTHD) {
    rows = t.k.shape()[0];
    used.assign(size_t(rows), false);
    const HostTensor& starts =
        t.cu_seqlens_kv_padded.defined() ? t.cu_seqlens_kv_padded : t.cu_seqlens_kv;
    for (size_t b = 0; b < spec.lengths_kv.size(); ++b)
      for (int64_t r = 0; r < spec.lengths_kv[b]; ++r)
        used[size_t(int64_t(starts.get(int64_t(b))) + r)] = true;
  } else {
    rows = t.k.shape()[1];
    used.assign(size_t(spec.batch * rows), false);
    for (int64_t b = 0; b < spec.batch; ++b)
      for (int64_t r = 0; r < spec.lengths_kv.at(size_t(b)); ++r) used[size_t(b * rows + r)] = true;
  }
  const int64_t k_row = spec.heads_kv * spec.head_dim_qk, v_row = spec.heads_kv * spec.head_dim_v;
  int64_t poisoned = 0;
  for (size_t row = 0; row < used.size(); ++row) {
    if (used[row]) continue;
    ++poisoned;
    for (int64_t e = 0; e < k_row; ++e) t.k.set(int64_t(row) * k_row + e, nan);
    for (int64_t e = 0; e < v_row; ++e) t.v.set(int64_t(row) * v_row + e, nan);
  }
  return poisoned;
}

bool poison_reaches_o_without_the_lengths(const CaseSpec& spec, const CaseTensors& tensors) {
  CaseSpec every_row = spec;
  every_row.lengths_q.clear();
  every_row.lengths_kv.clear();
  every_row.config.mask_type = MaskType::kCausalBottomRight;
  CaseTensors full = tensors;
  full.cu_seqlens_q = full.cu_seqlens_kv = HostTensor();
  return has_nan(run_case(every_row, full, BackendKind::kCpuExact, /*backward=*/false).o);
}

std::vector<unsigned char> bytes_of(const CaseOutputs& out) {
  std::vector<unsigned char> bytes;
  for (const HostTensor* t :
       {&out.o, &out.lse, &out.dq, &out.dk, &out.dv, &out.dbias, &out.dsoftmax_offset}) {
    if (!t->defined()) continue;
    const size_t size = size_t(t->numel()) * dtype_size(t->dtype());
    const unsigned char* data = static_cast<const unsigned char*>(t->view().data);
    bytes.insert(bytes.end(), data, data + size);
  }
  return bytes;
}

CaseOutputs run_case(const CaseSpec& spec, const CaseTensors& t, BackendKind backend,
                     bool backward) {
  AttentionConfig config = spec.config;
  config.backend = backend;
  DotProductAttention attention(config);
  CaseOutputs out;
  const bool thd = config.format == Format::kTHD;
  std::vector<int64_t> o_shape = t.d_o.shape();
  out.o = HostTensor(spec.dtype, o_shape);
  const int64_t heads = spec.heads_q;
  if (thd)
    out.lse = HostTensor(DType::kFloat32, {heads, t.q.shape()[0]});
  else
    out.lse = HostTensor(
        DType::kFloat32,
        {spec.batch, heads, config.format == Format::kBSHD ? t.q.shape()[1] : t.q.shape()[0]});
  ForwardArgs fwd;
  fwd.in = t.inputs();
  fwd.o = out.o.view();
  fwd.lse = out.lse.view();
  fwd.rng = RngState{config.seed, 7};
  ForwardResult result = attention.forward(fwd);
  out.forward_backend = result.backend;
  if (!backward) return out;

  out.dq = HostTensor(spec.dtype, t.q.shape());
  out.dk = HostTensor(spec.dtype, t.k.shape());
  out.dv = HostTensor(spec.dtype, t.v.shape());
  BackwardArgs bwd;
  bwd.in = fwd.in;
  bwd.o = out.o.view();
  bwd.lse = out.lse.view();
  bwd.d_o = t.d_o.view();
  bwd.dq = out.dq.view();
  bwd.dk = out.dk.view();
  bwd.dv = out.dv.view();
  bwd.rng = result.rng;
  if (t.bias.defined() && spec.want_dbias) {
    out.dbias = HostTensor(t.bias.dtype(), t.bias.shape());
    bwd.dbias = out.dbias.view();
  }
  if (t.softmax_offset.defined() && spec.want_dsoftmax_offset) {
    out.dsoftmax_offset = HostTensor(DType::kFloat32, t.softmax_offset.shape());
    bwd.dsoftmax_offset = out.dsoftmax_offset.view();
  }
  out.backward_backend = attention.backward(bwd);
  return out;
}

double CaseComparison::worst() const {
  return std::max({o, lse, dq, dk, dv, dbias, dsoftmax_offset});
}

CaseComparison compare_outputs(const CaseOutputs& got, const CaseOutputs& reference) {
  CaseComparison c;
  auto cmp = [](const HostTensor& a, const HostTensor& b) {
    if (!a.defined() && !b.defined()) return 0.0;
    return relative_error(a, b);
  };
  c.o = cmp(got.o, reference.o);
  c.lse = cmp(got.lse, reference.lse);
  c.dq = cmp(got.dq, reference.dq);
  c.dk = cmp(got.dk, reference.dk);
  c.dv = cmp(got.dv, reference.dv);
  c.dbias = cmp(got.dbias, reference.dbias);
  c.dsoftmax_offset = cmp(got.dsoftmax_offset, reference.dsoftmax_offset);
  return c;
}

}  // namespace dpa::test
