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
};

SequenceTables upload_sequence_tables(const AttentionProblem& problem, cudaStream_t stream);

}  // namespace dpa::cuda
