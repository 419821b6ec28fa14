// The configurations every GPU backend is checked on (issue 3, item 5): odd sizes, every head
// dim, GQA/MQA, thd with empty and length-1 sequences, fully masked rows, caps 0.5 to 50,
// sinks, every mask type, windows in both alignments, ALiBi, dropout, bias.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "support/attention_case.h"

namespace dpa::test {

struct GpuCase {
  std::string name;  // the gtest parameter name: letters, digits and '_'
  std::function<void(CaseSpec&)> configure;
  // Removes the feature under test; when set, the test first proves that the feature moves the
  // cpu_exact o by more than 10x the o tolerance (DESIGN.md §9).
  std::function<void(CaseSpec&)> without;
  bool flash = true;    // cuda_flash honours it (forward)
  bool unfused = true;  // cuda_unfused honours it (forward and backward)
  // Added to every q and k entry after make_case: logits that are large *and* close together,
  // where a cap of 50 bends their differences (with zero-mean inputs large logits are far apart,
  // the softmax is one-hot and capping leaves it so).
  double qk_mean = 0.0;
  // Added to the learnable sink offsets (~ 5 * randn): a sink that matters next to 4k keys.
  double sink_mean = 0.0;
};

// gtest prints parameters; keep it to the name.
inline std::ostream& operator<<(std::ostream& out, const GpuCase& c) { return out << c.name; }

std::vector<GpuCase> gpu_cases();
std::vector<GpuCase> flash_cases();    // gpu_cases() that cuda_flash takes
std::vector<GpuCase> unfused_cases();  // gpu_cases() that cuda_unfused takes

// The case's spec: the shared base (bf16, b=2, sq=97, skv=300, H=4, G=2, d=128) configured.
CaseSpec gpu_case_spec(const GpuCase& c);

// The case's host tensors: make_case plus the case's mean shifts (cached per case).
CaseTensors make_gpu_case_tensors(const GpuCase& c, const CaseSpec& spec);
const CaseTensors& gpu_case_tensors(const GpuCase& c);

// Checks (once per process and case) that the case's feature moves the cpu_exact o by more than
// 10x the o tolerance of its dtype. No-op for cases without a `without`.
void expect_feature_moves_reference(const GpuCase& c);

// Runs one case on `backend` (forward, and backward when `backward`) and compares every output
// with cpu_exact on the same inputs. Honours reference_only_mode().
void check_case_on_backend(const GpuCase& c, BackendKind backend, bool backward);

}  // namespace dpa::test
