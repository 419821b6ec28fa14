// GPU test support: device copies of a test case's host tensors, one attention call on a CUDA
// backend through the public API, and the comparison with cpu_exact on the same rounded inputs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "support/attention_case.h"
#include "support/device_tensor.h"
#include "support/host_tensor.h"

namespace dpa::test {

// True when a CUDA device of sm_80 or newer is present (cuda_flash needs it); otherwise `why`
// says what is missing. Never fails: no driver counts as no device.
bool gpu_present(std::string* why);

// DPA_GPU_TESTS_REFERENCE_ONLY=1: run only the cpu_exact half of every test (the relevance
// checks and the reference itself), then skip. For tuning inputs and timing the oracle on a
// machine without a GPU; the default is off.
bool reference_only_mode();

// How run_device_case makes its calls.
struct DeviceCallMode {
  // Each call gets a poisoned block of exactly DotProductAttention::workspace_size() bytes.
  bool caller_workspace = false;
  // Each call is captured into a CUDA graph and runs as one launch of it (run_captured).
  bool captured = false;
};

// Runs forward (and backward when `backward`) of `spec` on `backend` with every tensor of the
// case on the device (cu_seqlens, sink offsets, ALiBi slopes, bias and mask too), on a
// non-blocking stream of its own, outputs poisoned first. Dropout uses RngState{seed, 7}, as
// run_case does. Outputs come back as host tensors shaped like run_case's.
CaseOutputs run_device_case(const CaseSpec& spec, const CaseTensors& tensors, BackendKind backend,
                            bool backward, DeviceCallMode mode = {});

// Captures `call`'s work on `stream` into a CUDA graph in cudaStreamCaptureModeGlobal (the
// strictest mode, torch.cuda.graph's default: any unsafe CUDA call in the process fails it),
// checks that no node of it copies from host memory (a replay would read the captured host
// address again), launches the graph once and waits for it. An exception from `call` ends the
// capture and propagates. Callers make one eager call first (as torch.cuda.graph asks): the
// library creates its memory pool and cuBLAS handles on first use.
void run_captured(void* stream, const std::function<void()>& call);

// Tolerances (relative norm) for o and for gradients, by storage dtype: the kernels see the
// same rounded inputs as cpu_exact, so the error is the rounding of P and of the outputs to 16
// bits plus fp32 accumulation (bf16 keeps 8 bits, fp16 11; fp32 storage is tighter still).
double output_tolerance(DType dtype);
double gradient_tolerance(DType dtype);
// How far spec's softcap moves cpu_exact's o (relative error against the same call without
// it): a capped case first shows that it can fail, by more than 10x output_tolerance.
double softcap_moves_o(const CaseSpec& spec, const CaseTensors& tensors);
// LSE: fp32 on every backend; each element must satisfy |got - ref| <= 5e-3 + 1e-3 |ref|
// (equal infinities pass, NaN never does).
constexpr double kLseAbsoluteTolerance = 5e-3;
constexpr double kLseRelativeTolerance = 1e-3;
// The largest |got - ref| / (atol + rtol |ref|) over all elements (<= 1 passes); +inf for NaN,
// shape mismatch or an infinity on one side only.
double lse_violation(const HostTensor& got, const HostTensor& ref);

// Expects every output `got` produced to match `reference`: o, LSE and (when `backward`) dq,
// dk, dv, dbias and dsoftmax_offset; no NaN anywhere. `what` labels the messages.
void expect_matches_reference(const CaseOutputs& got, const CaseOutputs& reference, DType dtype,
                              bool backward, const std::string& what);

// The cpu_exact outputs of a named case, computed once per process and shared by every suite
// that tests the same case (the oracle is slow; each suite needs the same reference).
// `backward` asks for gradients too; a cached forward-only result is recomputed when needed.
const CaseOutputs& exact_reference(const std::string& name, const CaseSpec& spec,
                                   const CaseTensors& tensors, bool backward);
// A case's host tensors, built once per name by `make`.
const CaseTensors& cached_tensors(const std::string& name,
                                  const std::function<CaseTensors()>& make);

}  // namespace dpa::test
