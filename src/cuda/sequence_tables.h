// Per-sequence lengths and start rows on the device, built from the validated problem, so
// that every kernel reads the same resolved tables (bshd padding and thd alike).
#pragma once

#include <cuda_runtime_api.h>

#include "core/problem.h"
#include "cuda/device_buffer.h"

namespace dpa::cuda {

struct SequenceTables {
  DeviceBuffer storage;
  const int* seqlen_q = nullptr;   // [b]
  const int* seqlen_kv = nullptr;  // [b]
  const int* start_q = nullptr;    // [b] first row of sequence b in the packed t axis (thd), or 0
  const int* start_kv = nullptr;   // [b]
  // [b] the diagonal offset of sequence b (AttentionProblem::diagonal_offset: bottom-right
  // skv - sq, top-left 0, or a CP tile's global delta in local coordinates).
  const int* diagonal = nullptr;
  // [b] a CP tile's first row / key in the unsharded sequence (0 outside CP): dropout draws and
  // unsharded bias / mask reads happen at local index + position.
  const int* q_position = nullptr;
  const int* kv_position = nullptr;
};

SequenceTables upload_sequence_tables(const AttentionProblem& problem, cudaStream_t stream);
size_t sequence_tables_bytes(const AttentionProblem& problem);

}  // namespace dpa::cuda
