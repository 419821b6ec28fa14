// AttentionConfig: the per-layer settings of DotProductAttention (DESIGN.md sections 3-6).
#pragma once

#include <cstdint>
#include <optional>

#include "dpa/types.h"

namespace dpa {

struct AttentionConfig {
  Format format = Format::kBSHD;
  MaskType mask_type = MaskType::kNoMask;
  // Sliding window (left, right); -1 is unbounded. Causal masks force right to 0, and a
  // causal mask with window_right > 0 is an error.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // Diagonal alignment for no_mask / padding / arbitrary (and the window/ALiBi placed with
  // them). Bottom-right by default, as in TransformerEngine and FlashAttention.
  bool bottom_right_diagonal = true;
  // Soft-cap c: s = c * tanh(u / c). 0 disables it; negative, NaN or infinite is an error.
  double softcap = 0.0;
  // Logit scale; unset means 1 / sqrt(dqk).
  std::optional<double> scale;
  SoftmaxType softmax_type = SoftmaxType::kVanilla;
  BiasType bias_type = BiasType::kNoBias;
  // Dropout probability in [0, 1); applied in training calls only.
  double dropout = 0.0;
  // Seed of the dropout RNG. The offset starts at 0 and advances by one per forward call that
  // draws dropout; a call may also pass its own (seed, offset).
  uint64_t seed = 0;
  // qk-layer-scaling (fp16 overflow guard): with layer_number L > 1 an implementation may
  // compute with scale/L and cap/L and multiply by L inside the softmax. 0 or 1 disables it.
  int layer_number = 0;
  // Bit-identical results across runs (backends that reduce with atomics refuse it or switch
  // to an ordered reduction).
  bool deterministic = false;
  // Force one backend; kAuto lets the selector pick. Left at kAuto, the DPA_BACKEND
  // environment variable fills it, read once when DotProductAttention or
  // ContextParallelAttention is constructed (an explicit value wins over the environment).
  BackendKind backend = BackendKind::kAuto;
  // cuda_flash's kernel families (tests and benches); kAuto fields are filled from
  // DPA_FLASH_FORWARD_KERNEL and DPA_FLASH_BACKWARD_KERNEL the same way.
  FlashForwardKernel flash_forward_kernel = FlashForwardKernel::kAuto;
  FlashBackwardKernel flash_backward_kernel = FlashBackwardKernel::kAuto;
};

// Dropout RNG state: Philox key (seed) and the fourth counter word (offset), DESIGN.md §5.
struct RngState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

}  // namespace dpa
