// The backend interface and the capability declaration that the selector reads.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/problem.h"

namespace dpa {

// What a call asks for, reduced to the facts the selector's rules test. Built from an
// AttentionProblem (no tensor contents needed), or by hand in selector tests.
// The context-parallel part of a FeatureRequest (from AttentionProblem::cp).
struct CpTileRequest {
  bool tile = false;  // a context-parallel tile (global positions, sink-free partial, given LSE)
  // A CP tile whose first key of some sequence is not a multiple of 8 in the unsharded
  // sequence (Philox draws come in blocks of 8 keys; kernels that draw a whole block per 8
  // local keys need the blocks aligned).
  bool keys_unaligned = false;
  // A CP tile's bias gradient: into the unsharded dbias at global positions (host backends), or
  // tile-local (CpTile::dbias_local; cuda_unfused).
  bool dbias_unsharded = false;
  bool dbias_local = false;
};

struct FeatureRequest {
  Pass pass = Pass::kForward;
  Device device = Device::kCPU;
  DType dtype = DType::kFloat32;
  Format format = Format::kBSHD;
  int64_t batch = 1, heads_q = 1, heads_kv = 1;
  int64_t max_seqlen_q = 1, max_seqlen_kv = 1;
  int64_t head_dim_qk = 64, head_dim_v = 64;
  MaskType mask_type = MaskType::kNoMask;
  // A finite left or right bound beyond what the mask implies.
  bool window = false;
  // The most keys one query sees when the window is bounded on both sides (a causal mask's
  // right bound is 0), else -1 (AttentionProblem::window_span).
  int64_t window_span = -1;
  // The diagonal of a causal mask, a window and ALiBi: bottom-right (query i of sq at key
  // i + skv - sq) or top-left (at key i).
  bool bottom_right = true;
  bool padded_offsets = false;  // thd with cu_seqlens_*_padded
  // AttentionProblem::queries_fill_rows / keys_fill_rows: every sequence has max_seqlen_q
  // queries (max_seqlen_kv keys) in bshd or sbhd, whichever the mask.
  bool queries_fill_rows = true;
  bool keys_fill_rows = true;
  BiasType bias_type = BiasType::kNoBias;
  bool bias_grad = false;
  bool alibi = false;
  bool softcap = false;
  double softcap_value = 0.0;  // the cap itself, where a kernel's form depends on it
  SoftmaxType softmax_type = SoftmaxType::kVanilla;
  bool sink_grad = false;
  bool dropout = false;
  bool deterministic = false;
  FlashForwardKernel flash_forward_kernel = FlashForwardKernel::kAuto;  // its tiles' size
  FlashBackwardKernel flash_backward_kernel = FlashBackwardKernel::kAuto;
  CpTileRequest cp;  // what a context-parallel tile asks for (all false: an ordinary call)
  // Every q/k/v/o (forward) and dO/dq/dk/dv (backward) row starts on a 16-byte boundary:
  // aligned base pointers and batch/row/head strides (kernels that copy rows in 16-byte chunks
  // need it; a misaligned access would be a sticky device error).
  bool rows_16_byte_aligned = true;
  int device_arch = 0;   // e.g. 90 for sm_90; 0 on the CPU
  int device_index = 0;  // of q's device (size limits query its free memory)
};

FeatureRequest make_feature_request(const AttentionProblem& problem);

struct Capabilities {
  BackendKind kind = BackendKind::kCpuExact;
  // Whether this build and machine can run it at all (e.g. "no CUDA device").
  bool available = true;
  std::string unavailable_reason;

  Device device = Device::kCPU;
  std::vector<DType> dtypes;
  std::vector<int64_t> head_dims_qk;  // empty: any size up to max_head_dim
  std::vector<int64_t> head_dims_v;   // empty: any size up to max_head_dim
  int64_t max_head_dim = 0;           // 0: unbounded
  bool different_head_dims = true;    // dqk != dv
  std::vector<Format> formats;
  std::vector<MaskType> mask_types;
  bool window = false;
  bool padded_offsets = false;
  std::vector<BiasType> bias_types;
  bool bias_grad = false;
  bool alibi = false;
  bool softcap = false;
  std::vector<SoftmaxType> softmax_types;
  bool sink_grad = false;
  bool dropout = false;
  bool backward = false;
  bool deterministic = false;  // can produce bit-identical results run to run
  // Honours AttentionProblem::cp (global positions, the sink-free partial, ...).
  bool cp_tiles = false;
  int min_arch = 0;  // minimal sm for GPU backends
  // Optional extra limit, e.g. memory for O(s^2) backends: a reason, or nullopt when it fits.
  std::function<std::optional<std::string>(const FeatureRequest&)> size_limit;
  // Further backend-specific requirements (e.g. which head-dim pairs have kernels), each a
  // reason or nullopt.
  std::vector<std::function<std::optional<std::string>(const FeatureRequest&)>> extra_rules;
  // What the backend would run for an eligible request (kernel family, tiles), for explain();
  // unset: nothing to say beyond its name.
  std::function<std::string(const FeatureRequest&)> describe_plan;
};

// Every attention feature of DESIGN.md §3-5 switched on (formats, masks, window, padded offsets,
// bias types and their gradient, ALiBi, softcap, sinks and their gradient, dropout, backward,
// determinism), for backends that implement the whole spec; dtypes, head dims and device
// limits are left for the backend to set. Partial backends list what they honour instead.
Capabilities full_feature_capabilities(BackendKind kind, Device device);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const Capabilities& capabilities() const = 0;
  // Preconditions: validation passed and the selector found this backend eligible.
  virtual void forward(const AttentionProblem& problem) const = 0;
  virtual void backward(const AttentionProblem& problem) const = 0;
  // Device scratch bytes that forward / backward (problem.pass) take from a caller's workspace
  // (core/workspace.h): every buffer the pass allocates, each aligned. 0 for host backends.
  virtual size_t workspace_bytes(const AttentionProblem& problem) const {
    (void)problem;
    return 0;
  }
};

// Every backend compiled into this build, fastest first (the selector's preference order).
// Defined by the composition root, src/api/registry.cc.
const std::vector<const Backend*>& registered_backends();

}  // namespace dpa
