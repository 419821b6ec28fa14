// The arguments and results of one attention call (DESIGN.md §11): inputs, outputs, the
// caller's workspace, the RNG state. Plain structs, included by the facade (dpa/attention.h)
// and by the library's core.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>

#include "dpa/config.h"
#include "dpa/tensor.h"

namespace dpa {

enum class Pass : int { kForward = 0, kBackward = 1 };

// The inputs shared by forward and backward. Optional tensors are left undefined
// (default-constructed) when unused.
struct AttentionInputs {
  TensorView q;  // bshd [b, sq, H, dqk]; sbhd [sq, b, H, dqk]; thd [tq, H, dqk]
  TensorView k;  // like q with skv and G heads
  TensorView v;  // like k with dv
  // int32 [b + 1]. thd: sequence boundaries (required). bshd/sbhd: per-sequence lengths
  // (cu[i+1] - cu[i]) for padding; absent means every sequence has the full length.
  TensorView cu_seqlens_q;
  TensorView cu_seqlens_kv;
  // thd only, int32 [b + 1]: where each sequence starts when stored with gaps.
  TensorView cu_seqlens_q_padded;
  TensorView cu_seqlens_kv_padded;
  TensorView bias;            // [b|1, H|1, sq|1, skv]; with bias_type pre_scale or post_scale
  TensorView alibi_slopes;    // fp32 [H] or [b, H]
  TensorView softmax_offset;  // fp32 [H]; with softmax_type learnable (alpha_h)
  TensorView attn_mask;       // bool [b|1, H|1, sq, skv], true = masked; mask_type arbitrary
};

// Device scratch memory from the caller's allocator (DESIGN.md §11), for GPU calls. Either a
// block the caller allocated (`data` on a 256-byte boundary, `bytes` >=
// DotProductAttention::workspace_size()), or an
// `allocate` callback that the call invokes at most once, after validation and selection, with
// the bytes the chosen backend needs (not at all when it needs none; its result must be 256-byte
// aligned too). The memory must stay valid
// until the call's work on its stream has run: a stream-ordered allocator on the same stream
// (PyTorch's caching allocator on its current stream) may reuse it as soon as the call returns.
// Empty (neither set): backends take stream-ordered memory from the CUDA driver's pool
// (cudaMallocAsync).
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
  std::function<void*(size_t bytes)> allocate;

  bool given() const { return data != nullptr || bool(allocate); }
};

struct ForwardArgs {
  AttentionInputs in;
  TensorView o;    // like q with dv, dtype of q
  TensorView lse;  // fp32 [b, H, sq] (thd: [H, tq]), contiguous
  // Dropout state for this call; unset draws (config.seed, next offset) from the object.
  std::optional<RngState> rng;
  // Per-call override of config.dropout (e.g. 0.0 for evaluation).
  std::optional<double> dropout;
  // CUDA stream (cudaStream_t) for device tensors; nullptr is the default stream.
  void* stream = nullptr;
  Workspace workspace;
};

struct BackwardArgs {
  AttentionInputs in;
  TensorView o;                // the forward output
  TensorView lse;              // the forward LSE
  TensorView d_o;              // like o
  TensorView dq, dk, dv;       // like q, k, v
  TensorView dbias;            // like bias; requests the bias gradient when defined
  TensorView dsoftmax_offset;  // fp32 [H]; requests dalpha when defined (learnable only)
  // Must equal what the forward returned when dropout is on.
  std::optional<RngState> rng;
  std::optional<double> dropout;
  void* stream = nullptr;  // cudaStream_t for device tensors
  Workspace workspace;
};

struct ForwardResult {
  BackendKind backend = BackendKind::kAuto;
  RngState rng;  // pass to backward
};

// The backward of one forward call: the forward's inputs, o, lse, dropout override and stream,
// the RNG state it returned, and the gradients to write. dbias and dsoftmax_offset stay
// undefined (set them to request those gradients); so does the workspace.
BackwardArgs backward_args_for(const ForwardArgs& forward, const ForwardResult& result,
                               TensorView d_o, TensorView dq, TensorView dk, TensorView dv);

}  // namespace dpa
