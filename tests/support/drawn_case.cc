#include "support/drawn_case.h"

namespace dpa::test {

DrawnCase draw_case(std::mt19937& rng, const DrawRanges& r, int index) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto chance = [&](int one_in) { return pick(1, one_in) == 1; };
  DrawnCase d;
  CaseSpec& s = d.spec;
  s.seed = uint64_t(1000 + index);
  s.dtype = r.dtypes[size_t(pick(0, int64_t(r.dtypes.size()) - 1))];
  const auto [dqk, dv] = r.head_dims[size_t(pick(0, int64_t(r.head_dims.size()) - 1))];
  s.head_dim_qk = dqk;
  s.head_dim_v = dv;
  if (r.heads_q > 0) {
    s.heads_q = r.heads_q;
    s.heads_kv = int64_t(1) << pick(0, 2);
  } else {
    s.heads_kv = int64_t(1) << pick(0, 1);
    s.heads_q = s.heads_kv * (int64_t(1) << pick(0, 2));
  }
  const int64_t layout = pick(0, 3);  // bshd, bshd with lengths, sbhd, thd
  const bool causal = chance(2), bottom_right = chance(2);
  auto padding_mask = [&] {
    return causal ? (bottom_right ? MaskType::kPaddingCausalBottomRight : MaskType::kPaddingCausal)
                  : MaskType::kPadding;
  };
  if (layout == 3) {
    s.config.format = Format::kTHD;
    for (int64_t b = pick(1, 3); b > 0; --b) {
      s.lengths_q.push_back(int32_t(pick(r.min_rows, r.max_thd_rows)));
      s.lengths_kv.push_back(r.thd_cross ? int32_t(pick(r.min_rows, r.max_thd_rows + 10))
                                         : s.lengths_q.back());
      if (r.thd_gaps) {
        s.gaps_q.push_back(chance(2) ? int32_t(pick(1, 7)) : 0);
        s.gaps_kv.push_back(chance(2) ? int32_t(pick(1, 7)) : 0);
      }
    }
    s.config.mask_type = padding_mask();
  } else {
    if (layout == 2) s.config.format = Format::kSBHD;
    s.batch = pick(1, 2);
    auto rows = [&](int64_t most) {
      const int64_t m = r.row_multiple;
      return m * pick((r.min_rows + m - 1) / m, most / m);
    };
    s.seqlen_q = rows(r.max_rows);
    s.seqlen_kv = chance(3) ? rows(r.max_rows + 20) : s.seqlen_q;  // cross attention
    if (layout == 1) {
      for (int64_t b = 0; b < s.batch; ++b) {
        s.lengths_q.push_back(int32_t(pick(r.min_rows, s.seqlen_q)));
        s.lengths_kv.push_back(int32_t(pick(r.min_rows, s.seqlen_kv)));
      }
      s.config.mask_type = padding_mask();
    } else if (!causal && r.arbitrary_masks && chance(4)) {
      s.config.mask_type = MaskType::kArbitrary;
    } else {
      s.config.mask_type = causal
                               ? (bottom_right ? MaskType::kCausalBottomRight : MaskType::kCausal)
                               : MaskType::kNoMask;
    }
    if (r.biases && chance(4)) {  // broadcast over any of its leading dims
      s.config.bias_type = chance(2) ? BiasType::kPostScale : BiasType::kPreScale;
      s.bias_shape = {chance(2) ? s.batch : 1, chance(2) ? s.heads_q : 1,
                      chance(4) ? 1 : s.seqlen_q, s.seqlen_kv};
    }
  }
  if (chance(3)) {  // a window: its left reach always, its right one without a causal mask
    s.config.window_left = pick(r.min_rows, 60);
    s.config.window_right = causal ? 0 : pick(0, 20);
    if (!causal) s.config.bottom_right_diagonal = bottom_right;
  }
  if (chance(3)) {  // logits of a few units, so that a cap of 2 bends them
    s.config.softcap = 2.0;
    s.config.scale = 1.0;
  }
  const int64_t softmax = pick(0, 2);
  s.config.softmax_type = softmax == 0   ? SoftmaxType::kVanilla
                          : softmax == 1 ? SoftmaxType::kOffByOne
                                         : SoftmaxType::kLearnable;
  s.alibi = chance(5);
  s.alibi_per_batch = s.alibi && layout != 3 && chance(2);
  if (chance(5)) {
    s.config.dropout = 0.1;
    s.config.seed = uint64_t(40 + index);
  }
  s.config.deterministic = r.deterministic && chance(4);
  std::string rows;
  auto append_pair = [&](int64_t a, int64_t b) {
    rows += std::to_string(a);
    rows += '/';
    rows += std::to_string(b);
  };
  if (layout == 3) {
    rows = " lengths";
    for (size_t b = 0; b < s.lengths_q.size(); ++b) {
      rows += ' ';
      append_pair(s.lengths_q[b], s.lengths_kv[b]);
    }
  } else {
    rows = " b ";
    rows += std::to_string(s.batch);
    rows += " s ";
    append_pair(s.seqlen_q, s.seqlen_kv);
  }
  d.what = "draw " + std::to_string(index) + ": " + std::string(to_string(s.dtype)) + " " +
           std::string(to_string(s.config.format)) + (layout == 1 ? " with lengths" : "") + rows +
           " heads " + std::to_string(s.heads_q) + "/" + std::to_string(s.heads_kv) + " dims " +
           std::to_string(dqk) + "/" + std::to_string(dv) + " mask " +
           std::string(to_string(s.config.mask_type)) + " window (" +
           std::to_string(s.config.window_left) + ", " + std::to_string(s.config.window_right) +
           ")" + (s.config.softcap > 0 ? " softcap" : "") + " softmax " +
           std::string(to_string(s.config.softmax_type)) + (s.alibi ? " alibi" : "") +
           (s.config.bias_type != BiasType::kNoBias ? " bias" : "") +
           (s.config.dropout > 0 ? " dropout" : "") +
           (s.config.deterministic ? " deterministic" : "");
  return d;
}

}  // namespace dpa::test
