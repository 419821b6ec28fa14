#include "cuda/unfused/unfused_gemm.h"

#include <climits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/unfused/cublas_check.h"

namespace dpa::cuda {
namespace {

// Idle handles per device. Handles are created on first need and kept for the life of the
// process: destroying them at exit would race the CUDA runtime's own teardown.
std::mutex pool_mutex;
std::map<int, std::vector<cublasHandle_t>>& idle_handles() {
  static auto* pool = new std::map<int, std::vector<cublasHandle_t>>();
  return *pool;
}

cublasHandle_t acquire_handle(int device_index) {
  {
    std::lock_guard<std::mutex> lock(pool_mutex);
    std::vector<cublasHandle_t>& idle = idle_handles()[device_index];
    if (!idle.empty()) {
      cublasHandle_t handle = idle.back();
      idle.pop_back();
      return handle;
    }
  }
  cublasHandle_t handle = nullptr;
  DPA_CUBLAS_CHECK(cublasCreate(&handle));  // binds to the current device
  return handle;
}

void release_handle(int device_index, cublasHandle_t handle) {
  std::lock_guard<std::mutex> lock(pool_mutex);
  idle_handles()[device_index].push_back(handle);
}

cudaDataType cuda_data_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
    case DType::kFloat32:
      return CUDA_R_32F;
    default:
      break;
  }
  throw Error(ErrorCode::kInternal, "",
              "cuda_unfused: no GEMM for dtype " + std::string(to_string(dtype)));
}

void require_gemm_fit(bool fits, const char* what) {
  if (!fits) throw Error(ErrorCode::kInternal, "", std::string("cuda_unfused GEMM: ") + what);
}

}  // namespace

CublasSession::CublasSession(int device_index, cudaStream_t stream)
    : device_index_(device_index), handle_(acquire_handle(device_index)) {
  try {
    // cublasSetStream resets the workspace to cuBLAS's default pool, so set ours after it.
    DPA_CUBLAS_CHECK(cublasSetStream(handle_, stream));
    workspace_ = DeviceBuffer(kWorkspaceBytes, stream);
    DPA_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_.get(), workspace_.bytes()));
  } catch (...) {
    release_handle(device_index_, handle_);
    throw;
  }
}

CublasSession::~CublasSession() {
  // The next lease sets its own stream and workspace before any use, so the handle does not
  // keep pointing at our workspace after it is freed (stream-ordered, after our GEMMs).
  release_handle(device_index_, handle_);
}

void batched_gemm_row_major(const CublasSession& session, bool transpose_a, bool transpose_b,
                            int64_t m, int64_t n, int64_t k, float alpha, const void* const* a,
                            int64_t lda, const void* const* b, int64_t ldb, float beta,
                            void* const* c, int64_t ldc, int64_t batch, DType input_dtype) {
  if (m == 0 || n == 0 || k == 0 || batch == 0) return;  // callers pre-zero C where it matters
  // Row-major leading-dimension rules; cuBLAS would reject a violation as INVALID_VALUE.
  require_gemm_fit(lda >= (transpose_a ? m : k), "lda too small");
  require_gemm_fit(ldb >= (transpose_b ? k : n), "ldb too small");
  require_gemm_fit(ldc >= n, "ldc too small");
  for (int64_t value : {m, n, k, lda, ldb, ldc, batch})
    require_gemm_fit(value > 0 && value <= INT_MAX, "dimension beyond int range");
  // cuBLAS is column-major: a row-major X is a column-major X^T, so compute
  // C^T [n, m] = op(B)^T [n, k] * op(A)^T [k, m], swapping the operands.
  const cudaDataType type = cuda_data_type(input_dtype);
  DPA_CUBLAS_CHECK(cublasGemmBatchedEx(session.handle(), transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m),
                                       int(k), &alpha, b, type, int(ldb), a, type, int(lda), &beta,
                                       c, CUDA_R_32F, int(ldc), int(batch), CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
}

}  // namespace dpa::cuda
