#include "support/dropout_probe.h"

#include <cmath>
#include <string>

#include "core/philox.h"

namespace dpa::test {
namespace {

// bshd [b, s, H, d] element index.
struct Indexing {
  int64_t s, heads, dim;
  int64_t operator()(int64_t b, int64_t i, int64_t h, int64_t x) const {
    return ((b * s + i) * heads + h) * dim + x;
  }
};

}  // namespace

const char* probe_name(DropoutProbe probe) {
  switch (probe) {
    case DropoutProbe::kOutputs:
      return "o and dv";
    case DropoutProbe::kDq:
      return "dq";
    case DropoutProbe::kDk:
      return "dk";
  }
  return "?";
}

CaseSpec dropout_probe_spec(DType dtype, int64_t seqlen_q, int64_t seqlen_kv, int64_t heads,
                            int64_t head_dim, MaskType mask) {
  CaseSpec spec;
  spec.dtype = dtype;
  spec.batch = 2;
  spec.seqlen_q = seqlen_q;
  spec.seqlen_kv = seqlen_kv;
  spec.heads_q = spec.heads_kv = heads;
  spec.head_dim_qk = spec.head_dim_v = head_dim;
  spec.config.mask_type = mask;
  spec.config.softcap = 1.0;
  spec.config.dropout = 0.3;
  spec.config.seed = 0x1234567890abcdefull;
  spec.want_dsoftmax_offset = false;
  return spec;
}

CaseTensors dropout_probe_tensors(const CaseSpec& spec, DropoutProbe probe) {
  const Indexing q_index{spec.seqlen_q, spec.heads_q, spec.head_dim_qk};
  const Indexing k_index{spec.seqlen_kv, spec.heads_kv, spec.head_dim_qk};
  CaseTensors t = make_case(spec);
  t.q.fill(0.0);
  t.k.fill(0.0);
  t.v.fill(0.0);
  t.d_o.fill(0.0);
  for (int64_t b = 0; b < spec.batch; ++b)
    for (int64_t h = 0; h < spec.heads_q; ++h) {
      for (int64_t j = 0; j < spec.seqlen_kv; ++j) {
        t.v.set(k_index(b, j, h, j), 1.0);
        if (probe == DropoutProbe::kDq) t.k.set(k_index(b, j, h, j), 1.0);
      }
      for (int64_t i = 0; i < spec.seqlen_q; ++i) {
        if (probe == DropoutProbe::kDk) t.q.set(q_index(b, i, h, i), 1.0);
        if (probe == DropoutProbe::kOutputs)
          t.d_o.set(q_index(b, i, h, i), 1.0);
        else
          for (int64_t j = 0; j < spec.seqlen_kv; ++j) t.d_o.set(q_index(b, i, h, j), 1.0);
      }
    }
  return t;
}

DropoutProbeCount count_dropout_probe(const CaseSpec& spec, DropoutProbe probe,
                                      const CaseOutputs& got, uint64_t offset) {
  const int64_t s_q = spec.seqlen_q, s_kv = spec.seqlen_kv, heads = spec.heads_q;
  const Indexing q_index{s_q, heads, spec.head_dim_qk};
  const Indexing k_index{s_kv, heads, spec.head_dim_qk};
  const double scale = 1.0 / std::sqrt(double(spec.head_dim_qk));  // the default
  const uint32_t threshold = dropout_threshold(spec.config.dropout);
  const double keep_prob = dropout_keep_prob(threshold);
  const MaskType mask = spec.config.mask_type;
  const int64_t delta = mask == MaskType::kCausalBottomRight ? s_kv - s_q : 0;
  auto visible = [&](int64_t i, int64_t j) { return mask == MaskType::kNoMask || j <= i + delta; };
  auto keeps = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    return dropout_keep(spec.config.seed, offset, b, heads, h, i, j, threshold);
  };

  DropoutProbeCount count;
  for (int64_t b = 0; b < spec.batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < s_q; ++i) {
        int64_t n = 0, kept_in_row = 0;
        for (int64_t j = 0; j < s_kv; ++j)
          if (visible(i, j)) {
            ++n;
            kept_in_row += keeps(b, h, i, j);
          }
        const double row_delta = double(kept_in_row) / (double(n) * keep_prob);
        for (int64_t j = 0; j < s_kv; ++j) {
          if (!visible(i, j)) continue;
          const bool keep = keeps(b, h, i, j);
          ++count.checked;
          count.kept += keep;
          if (probe == DropoutProbe::kOutputs) {
            const bool forward_kept = got.o.get(q_index(b, i, h, j)) != 0.0;
            const bool backward_kept = got.dv.get(k_index(b, j, h, i)) != 0.0;
            count.wrong += (forward_kept != keep) + (backward_kept != keep);
          } else {
            const double expected =
                scale * ((keep ? 1.0 / keep_prob : 0.0) - row_delta) / double(n);
            const double value = probe == DropoutProbe::kDq ? got.dq.get(q_index(b, i, h, j))
                                                            : got.dk.get(k_index(b, j, h, i));
            // A wrong bit moves the element by scale / (n keep_prob); rounding by far less.
            count.wrong += std::fabs(value - expected) > 0.25 * scale / (double(n) * keep_prob);
          }
        }
      }
  return count;
}

std::string dropout_probe_failure(DropoutProbe probe, const DropoutProbeCount& count) {
  const std::string of = " of " + std::to_string(count.checked) + " visible elements";
  if (count.checked - count.kept <= count.checked / 5 || count.kept <= count.checked / 2)
    return std::string("the mask hardly matters: ") + std::to_string(count.kept) + " kept" + of;
  if (count.wrong != 0)
    return std::string(probe_name(probe)) + ": " + std::to_string(count.wrong) + " wrong" + of;
  return "";
}

}  // namespace dpa::test
