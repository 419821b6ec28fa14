// Test support: build a complete attention call (inputs, outputs) from a compact spec and run
// it through the public API on a chosen backend.
#pragma once

#include <cstdint>
#include <vector>

#include "dpa/attention.h"
#include "support/host_tensor.h"

namespace dpa::test {

struct CaseSpec {
  AttentionConfig config;
  DType dtype = DType::kFloat64;
  int64_t batch = 2, seqlen_q = 5, seqlen_kv = 7, heads_q = 4, heads_kv = 2;
  int64_t head_dim_qk = 8, head_dim_v = 8;
  // thd: each sequence's length (required). bshd/sbhd: padding lengths (empty = full).
  std::vector<int32_t> lengths_q, lengths_kv;
  // thd only: unused rows after each sequence (padded offsets); empty = packed.
  std::vector<int32_t> gaps_q, gaps_kv;
  std::vector<int64_t> bias_shape;  // [b|1, H|1, sq|1, skv] when config.bias_type != none
  bool alibi = false;
  bool alibi_per_batch = false;
  double mask_density = 0.3;  // arbitrary masks: fraction of masked pairs
  double qk_stddev = 1.0;     // of q and k entries
  double sink_stddev = 5.0;   // learnable offsets ~ sink_mean + sink_stddev * randn
  double sink_mean = 0.0;
  uint64_t seed = 1;
  bool want_dbias = true;
  bool want_dsoftmax_offset = true;
};

struct CaseTensors {
  HostTensor q, k, v, d_o;
  HostTensor cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded;
  HostTensor bias, alibi_slopes, softmax_offset, attn_mask;
  AttentionInputs inputs() const;
};

struct CaseOutputs {
  HostTensor o, lse, dq, dk, dv, dbias, dsoftmax_offset;
  BackendKind forward_backend = BackendKind::kAuto;
  BackendKind backward_backend = BackendKind::kAuto;
};

CaseTensors make_case(const CaseSpec& spec);

// Sets every k and v row that lies outside all sequences (bshd: rows lengths_kv[b] .. of batch
// b; thd: rows outside every [start, start + length) of the padded offsets) to NaN, and returns
// how many rows: a backend must never let them reach a result.
int64_t poison_rows_past_sequences(const CaseSpec& spec, CaseTensors& tensors);

// For a poisoned bshd case: whether cpu_exact's o turns NaN when the same tensors are read as
// full-length sequences (no lengths), i.e. whether the poison would reach a result that read
// those rows. Shows that a test of the rows can fail.
bool poison_reaches_o_without_the_lengths(const CaseSpec& spec, const CaseTensors& tensors);

// Runs forward (and backward when `backward`) with `spec.config` and the given backend forced.
// Dropout uses RngState{spec.config.seed, 7}.
CaseOutputs run_case(const CaseSpec& spec, const CaseTensors& tensors, BackendKind backend,
                     bool backward = true);

// Every output as raw bytes, for bit-exact comparisons.
std::vector<unsigned char> bytes_of(const CaseOutputs& out);

// The largest relative error over every output both runs produced.
struct CaseComparison {
  double o = 0, lse = 0, dq = 0, dk = 0, dv = 0, dbias = 0, dsoftmax_offset = 0;
  double worst() const;
};
CaseComparison compare_outputs(const CaseOutputs& got, const CaseOutputs& reference);

}  // namespace dpa::test
