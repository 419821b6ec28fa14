// Error checking for cuBLAS calls: a failed status becomes dpa::Error(kBackendFailure) with the
// call, cuBLAS's status string and file:line, like DPA_CUDA_CHECK (STYLE.md habit 6).
#pragma once

#include <cublas_v2.h>

#include <string>

#include "dpa/error.h"

namespace dpa::cuda {

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call,
                                            const char* file, int line) {
  throw Error(ErrorCode::kBackendFailure, "",
              std::string(call) + " failed: " + cublasGetStatusString(status) + " (" + file + ":" +
                  std::to_string(line) + ")");
}

}  // namespace dpa::cuda

#define DPA_CUBLAS_CHECK(call)                                                        \
  do {                                                                                \
    cublasStatus_t dpa_cublas_status_ = (call);                                       \
    if (dpa_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                  \
      ::dpa::cuda::throw_cublas_error(dpa_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)
