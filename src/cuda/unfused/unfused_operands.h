// Host-side plumbing shared by the unfused forward and backward: the device guard, GEMM views
// of the strided q/k/v/dO tensors (without copying them), the batch-pointer tables that map
// query head h to KV head h / (H/G), and the per-sequence GEMM batches of padded/thd inputs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/problem.h"
#include "cuda/device_buffer.h"
#include "cuda/runtime.h"
#include "cuda/sequence_tables.h"
#include "cuda/unfused/unfused_kernels.h"

namespace dpa::cuda {

// A [.., s, heads, width] tensor as one row-major [rows, width] GEMM matrix per (batch, head):
// `matrix(b, h)` is row 0 of sequence b, head h, and `ld` the row stride. Tensors whose row
// stride cuBLAS cannot take (smaller than the width, e.g. a stride-0 broadcast, or beyond int)
// are packed into a contiguous copy first; that copy is the only data movement of inputs.
class GemmSource {
 public:
  GemmSource(const AttentionProblem& problem, const TensorView& tensor, const RowLayout& layout,
             bool query_side, int64_t heads, int64_t width, cudaStream_t stream);

  const void* matrix(int64_t b, int64_t h) const;
  int64_t ld() const { return ld_; }
  bool packed() const { return staging_.bytes() > 0; }

  // The contiguous copy's bytes (0 when the tensor is used in place): the workspace query.
  static size_t staging_bytes(const AttentionProblem& problem, const TensorView& tensor,
                              const RowLayout& layout, bool query_side, int64_t heads,
                              int64_t width);

 private:
  static bool needs_packing(const AttentionProblem& problem, const RowLayout& layout,
                            bool query_side, int64_t width);

  const char* data_ = nullptr;
  size_t element_bytes_ = 0;
  RowLayout layout_;
  int64_t ld_ = 0;
  DeviceBuffer staging_;
};

// Batch-pointer arrays for cublasGemmBatchedEx, built on the host and uploaded once per pass.
// A section holds one pointer per batch entry of some GEMM, in that GEMM's batch order.
class PointerTable {
 public:
  // Appends a section and returns its index.
  size_t add(std::vector<const void*> pointers);
  void upload(cudaStream_t stream);
  // Device pointer to entry `first` of section `section` (after upload).
  const void* const* at(size_t section, int64_t first) const;
  void* const* writable_at(size_t section, int64_t first) const;

 private:
  std::vector<const void*> host_;
  std::vector<size_t> starts_;
  DeviceBuffer device_;
};

// The GEMMs of a pass run over these batch groups: all sequences at once when every sequence
// has the full padded length, else one group per sequence with its own lengths, so no GEMM
// ever reads a row outside a sequence (padding and thd gaps may hold anything, even NaN).
// Sequences with no query or no key row are skipped (their outputs stay zero).
struct SequenceGroup {
  int64_t first_batch = 0, batches = 0;
  int64_t seqlen_q = 0, seqlen_kv = 0;
};
std::vector<SequenceGroup> sequence_groups(const AttentionProblem& problem);

// Kernel-side views of the problem.
ScoreGrid score_grid(const AttentionProblem& problem, const int* seqlen_q, const int* seqlen_kv,
                     const int* start_q);
LogitTransform logit_transform(const AttentionProblem& problem, const SequenceTables& tables);
RowStrides row_strides(const RowLayout& layout);

}  // namespace dpa::cuda
