// cuBLAS for the unfused backend: handles leased from a per-device pool, and the one batched
// GEMM shape every product of the backend uses (row-major, 16-bit or fp32 inputs, fp32 output
// and accumulation).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/device_buffer.h"
#include "dpa/types.h"

namespace dpa::cuda {

// One call's cuBLAS handle: leased from a pool of the device's handles (so concurrent calls
// from several threads never share one), bound to the call's stream, with a workspace that is
// allocated on that stream. A stream-ordered workspace cannot be overwritten by another stream
// while our GEMMs still run, and a fixed workspace keeps cuBLAS's algorithm choice, and so its
// results, the same from run to run. Construct with the device current.
class CublasSession {
 public:
  CublasSession(int device_index, cudaStream_t stream);
  ~CublasSession();
  CublasSession(const CublasSession&) = delete;
  CublasSession& operator=(const CublasSession&) = delete;

  cublasHandle_t handle() const { return handle_; }

  // Bytes of the per-call cuBLAS workspace (cuBLAS recommends 32 MiB on Hopper, 4 MiB before).
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;

 private:
  int device_index_;
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
};

// For n < batch: C_n = alpha * op(A_n) * op(B_n) + beta * C_n with row-major matrices,
// op(A_n) [m, k], op(B_n) [k, n], C_n [m, n] fp32. A_n is stored [m, k] (or [k, m] when
// transpose_a) with row stride lda; likewise B_n. `a`, `b`, `c` are device arrays of batch
// pointers. Inputs have `input_dtype` (f16, bf16 or f32); accumulation is fp32.
void batched_gemm_row_major(const CublasSession& session, bool transpose_a, bool transpose_b,
                            int64_t m, int64_t n, int64_t k, float alpha, const void* const* a,
                            int64_t lda, const void* const* b, int64_t ldb, float beta,
                            void* const* c, int64_t ldc, int64_t batch, DType input_dtype);

}  // namespace dpa::cuda
