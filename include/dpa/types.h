// Enumerations shared by the public C++ API, the C ABI and every backend.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dpa {

enum class DType : int {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat64 = 3,
  kInt32 = 4,
  kBool = 5
};
enum class Device : int { kCPU = 0, kCUDA = 1 };
enum class Format : int { kBSHD = 0, kSBHD = 1, kTHD = 2 };

// Mask types follow TransformerEngine's names (DESIGN.md section 3).
enum class MaskType : int {
  kNoMask = 0,
  kPadding = 1,
  kCausal = 2,
  kPaddingCausal = 3,
  kCausalBottomRight = 4,
  kPaddingCausalBottomRight = 5,
  kArbitrary = 6,
};

// The sink logit sigma_h: none, a constant 0, or a trainable per-head alpha_h.
enum class SoftmaxType : int { kVanilla = 0, kOffByOne = 1, kLearnable = 2 };

// Where an explicit bias tensor enters: before the scale (and the cap) or after the cap.
// ALiBi is not a bias type: it is enabled by passing slopes and always enters post-cap.
enum class BiasType : int { kNoBias = 0, kPreScale = 1, kPostScale = 2 };

enum class BackendKind : int {
  kAuto = -1,
  kCpuExact = 0,
  kCpu = 1,
  kCudaUnfused = 2,
  kCudaFlash = 3,
};

// Which cuda_flash kernel family runs a pass (docs/cuda_flash.md); kAuto lets the backend
// choose by device, head dims and features. For tests and benches that compare families; a
// family the device cannot run falls back to the one it can (sm_90 code runs on sm_90 only).
enum class FlashForwardKernel : int {
  kAuto = 0,
  kMmaSync = 1,  // the mma.sync family (what sm_80 runs) on every device
  // 2 was the plain two-warpgroup wgmma form, removed in session 32 (no head dim ran it).
  kWgmmaWs = 3,  // the warp-specialised wgmma form at every wgmma head dim
};
enum class FlashBackwardKernel : int {
  kAuto = 0,
  kMmaSync = 1,    // the atomic-free mma.sync pair
  kOneKernel = 4,  // the single-kernel family (sm_90; at head dim 256 never against dropout)
};

std::size_t dtype_size(DType dtype);
bool is_floating(DType dtype);

std::string_view to_string(DType v);
std::string_view to_string(Device v);
std::string_view to_string(Format v);
std::string_view to_string(MaskType v);
std::string_view to_string(SoftmaxType v);
std::string_view to_string(BiasType v);
std::string_view to_string(BackendKind v);
std::string_view to_string(FlashForwardKernel v);
std::string_view to_string(FlashBackwardKernel v);

// Parsers accept exactly the names that to_string prints (and a few documented aliases,
// e.g. "off_by_one" for "off-by-one"); they return nullopt for anything else.
std::optional<DType> parse_dtype(std::string_view name);
std::optional<Format> parse_format(std::string_view name);
std::optional<MaskType> parse_mask_type(std::string_view name);
std::optional<SoftmaxType> parse_softmax_type(std::string_view name);
std::optional<BiasType> parse_bias_type(std::string_view name);
std::optional<BackendKind> parse_backend(std::string_view name);
std::optional<FlashForwardKernel> parse_flash_forward_kernel(std::string_view name);
std::optional<FlashBackwardKernel> parse_flash_backward_kernel(std::string_view name);

// Mask properties used by validation and by every backend.
bool mask_is_causal(MaskType m);
bool mask_is_padding(MaskType m);
// Alignment of the diagonal: bottom-right for the *_bottom_right masks, top-left for the other
// causal ones, and the config's bottom_right_diagonal for no_mask / padding / arbitrary.
bool mask_bottom_right(MaskType m, bool bottom_right_diagonal);

}  // namespace dpa
