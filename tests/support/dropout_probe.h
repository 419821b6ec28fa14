// Inputs that make an attention call's outputs show its dropout mask bit for bit, and the check
// of those outputs against the Philox mapping of DESIGN.md §5 at global positions. Every probe
// makes the logits 0 (q.k = 0; capped or not), so P is uniform over a row's n_i visible keys,
// and v_j = e_j:
// - kOutputs: o_i[j] = P keep_ij / keep_prob, nonzero exactly where row i keeps key j (the
//   forward); with dO_i = e_i, dv_j[i] = Pd_ij: the same bits from the backward's own draw;
// - with dO_i = ones (over the keys) dP_ij = keep_ij / keep_prob and D_i = sum_j Pd_ij, so
//   dU_ij = (keep_ij / keep_prob - D_i) / n_i: kDq (k_j = e_j, q = 0) shows the bits dq used
//   in dq_i[j] = scale dU_ij, kDk (q_i = e_i, k = 0) those dk used in dk_j[i] = scale dU_ij.
//   A wrong bit moves an element by scale / (n_i keep_prob).
// The case: bshd, head_dim_qk == head_dim_v, no GQA (dk and dv would sum over a group's heads),
// seqlen_q and seqlen_kv at most the head dim (rows are unit vectors), no mask, causal or causal
// bottom-right.
#pragma once

#include <cstdint>
#include <string>

#include "support/attention_case.h"

namespace dpa::test {

enum class DropoutProbe { kOutputs, kDq, kDk };
constexpr DropoutProbe kDropoutProbes[] = {DropoutProbe::kOutputs, DropoutProbe::kDq,
                                           DropoutProbe::kDk};

// A probe case: bshd, b = 2, `heads` query and KV heads, head dim `head_dim` (at least both
// lengths), softcap 1 (the cap moves nothing at logit 0 but takes its code path), dropout 0.3.
CaseSpec dropout_probe_spec(DType dtype, int64_t seqlen_q, int64_t seqlen_kv, int64_t heads,
                            int64_t head_dim, MaskType mask);

const char* probe_name(DropoutProbe probe);  // "o and dv", "dq", "dk"

// The case's tensors for `probe` (random tensors of `spec` with q, k, v and dO overwritten).
CaseTensors dropout_probe_tensors(const CaseSpec& spec, DropoutProbe probe);

struct DropoutProbeCount {
  int64_t checked = 0;  // visible elements
  int64_t kept = 0;     // of which the mapping keeps
  int64_t wrong = 0;    // elements (o and dv: each of the two) that disagree with it
};

// Compares a run's outputs (forward and backward of `spec` on dropout_probe_tensors(spec,
// probe), drawn with RngState{spec.config.seed, offset}) with the mapping.
DropoutProbeCount count_dropout_probe(const CaseSpec& spec, DropoutProbe probe,
                                      const CaseOutputs& got, uint64_t offset);

// Empty when the count shows the mapping's bits exactly and the mask mattered (about 30% of the
// visible elements dropped), else what went wrong.
std::string dropout_probe_failure(DropoutProbe probe, const DropoutProbeCount& count);

}  // namespace dpa::test
