// Error checking for CUDA and cuBLAS calls: failures become dpa::Error(kBackendFailure) with
// the call, the error string and file:line. Never exits (STYLE.md habit 6).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "dpa/error.h"

namespace dpa::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t error, const char* call, const char* file,
                                          int line) {
  throw Error(ErrorCode::kBackendFailure, "",
              std::string(call) + " failed: " + cudaGetErrorString(error) + " (" + file + ":" +
                  std::to_string(line) + ")");
}

}  // namespace dpa::cuda

#define DPA_CUDA_CHECK(call)                                                      \
  do {                                                                            \
    cudaError_t dpa_cuda_status_ = (call);                                        \
    if (dpa_cuda_status_ != cudaSuccess)                                          \
      ::dpa::cuda::throw_cuda_error(dpa_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

// After every kernel launch: launch-configuration errors surface here, not later.
#define DPA_CUDA_CHECK_LAUNCH() DPA_CUDA_CHECK(cudaGetLastError())
