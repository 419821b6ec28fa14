#include "dpa/types.h"

#include <array>
#include <utility>

#include "dpa/error.h"
#include "dpa/tensor.h"

namespace dpa {
namespace {

template <typename Enum, size_t N>
using NameTable = std::array<std::pair<Enum, std::string_view>, N>;

constexpr NameTable<DType, 6> kDTypeNames{{{DType::kFloat16, "float16"},
                                           {DType::kBFloat16, "bfloat16"},
                                           {DType::kFloat32, "float32"},
                                           {DType::kFloat64, "float64"},
                                           {DType::kInt32, "int32"},
                                           {DType::kBool, "bool"}}};
constexpr NameTable<Format, 3> kFormatNames{
    {{Format::kBSHD, "bshd"}, {Format::kSBHD, "sbhd"}, {Format::kTHD, "thd"}}};
constexpr NameTable<MaskType, 7> kMaskNames{
    {{MaskType::kNoMask, "no_mask"},
     {MaskType::kPadding, "padding"},
     {MaskType::kCausal, "causal"},
     {MaskType::kPaddingCausal, "padding_causal"},
     {MaskType::kCausalBottomRight, "causal_bottom_right"},
     {MaskType::kPaddingCausalBottomRight, "padding_causal_bottom_right"},
     {MaskType::kArbitrary, "arbitrary"}}};
constexpr NameTable<SoftmaxType, 3> kSoftmaxNames{{{SoftmaxType::kVanilla, "vanilla"},
                                                   {SoftmaxType::kOffByOne, "off-by-one"},
                                                   {SoftmaxType::kLearnable, "learnable"}}};
constexpr NameTable<BiasType, 3> kBiasNames{{{BiasType::kNoBias, "no_bias"},
                                             {BiasType::kPreScale, "pre_scale"},
                                             {BiasType::kPostScale, "post_scale"}}};
constexpr NameTable<BackendKind, 5> kBackendNames{{{BackendKind::kAuto, "auto"},
                                                   {BackendKind::kCpuExact, "cpu_exact"},
                                                   {BackendKind::kCpu, "cpu"},
                                                   {BackendKind::kCudaUnfused, "cuda_unfused"},
                                                   {BackendKind::kCudaFlash, "cuda_flash"}}};
constexpr NameTable<FlashForwardKernel, 3> kFlashForwardNames{
    {{FlashForwardKernel::kAuto, "auto"},
     {FlashForwardKernel::kMmaSync, "mma_sync"},
     {FlashForwardKernel::kWgmmaWs, "wgmma_ws"}}};
constexpr NameTable<FlashBackwardKernel, 3> kFlashBackwardNames{
    {{FlashBackwardKernel::kAuto, "auto"},
     {FlashBackwardKernel::kMmaSync, "mma_sync"},
     {FlashBackwardKernel::kOneKernel, "one_kernel"}}};

template <typename Enum, size_t N>
std::string_view name_of(const NameTable<Enum, N>& table, Enum value) {
  for (const auto& [key, name] : table)
    if (key == value) return name;
  return "unknown";
}

template <typename Enum, size_t N>
std::optional<Enum> parse_name(const NameTable<Enum, N>& table, std::string_view name) {
  for (const auto& [key, entry] : table)
    if (entry == name) return key;
  return std::nullopt;
}

}  // namespace

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kBool:
      return 1;
  }
  return 0;
}

bool is_floating(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32 ||
         dtype == DType::kFloat64;
}

std::string_view to_string(DType v) { return name_of(kDTypeNames, v); }
std::string_view to_string(Device v) { return v == Device::kCPU ? "cpu" : "cuda"; }
std::string_view to_string(Format v) { return name_of(kFormatNames, v); }
std::string_view to_string(MaskType v) { return name_of(kMaskNames, v); }
std::string_view to_string(SoftmaxType v) { return name_of(kSoftmaxNames, v); }
std::string_view to_string(BiasType v) { return name_of(kBiasNames, v); }
std::string_view to_string(BackendKind v) { return name_of(kBackendNames, v); }
std::string_view to_string(FlashForwardKernel v) { return name_of(kFlashForwardNames, v); }
std::string_view to_string(FlashBackwardKernel v) { return name_of(kFlashBackwardNames, v); }

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "fp16" || name == "half") return DType::kFloat16;
  if (name == "bf16") return DType::kBFloat16;
  if (name == "fp32" || name == "float") return DType::kFloat32;
  if (name == "fp64" || name == "double") return DType::kFloat64;
  return parse_name(kDTypeNames, name);
}
std::optional<Format> parse_format(std::string_view name) { return parse_name(kFormatNames, name); }
std::optional<MaskType> parse_mask_type(std::string_view name) {
  return parse_name(kMaskNames, name);
}
std::optional<SoftmaxType> parse_softmax_type(std::string_view name) {
  if (name == "off_by_one") return SoftmaxType::kOffByOne;
  return parse_name(kSoftmaxNames, name);
}
std::optional<BiasType> parse_bias_type(std::string_view name) {
  if (name == "pre_scale_bias") return BiasType::kPreScale;
  if (name == "post_scale_bias") return BiasType::kPostScale;
  if (name == "none") return BiasType::kNoBias;
  return parse_name(kBiasNames, name);
}
std::optional<BackendKind> parse_backend(std::string_view name) {
  return parse_name(kBackendNames, name);
}
std::optional<FlashForwardKernel> parse_flash_forward_kernel(std::string_view name) {
  return parse_name(kFlashForwardNames, name);
}
std::optional<FlashBackwardKernel> parse_flash_backward_kernel(std::string_view name) {
  return parse_name(kFlashBackwardNames, name);
}

bool mask_is_causal(MaskType m) {
  return m == MaskType::kCausal || m == MaskType::kPaddingCausal ||
         m == MaskType::kCausalBottomRight || m == MaskType::kPaddingCausalBottomRight;
}
bool mask_is_padding(MaskType m) {
  return m == MaskType::kPadding || m == MaskType::kPaddingCausal ||
         m == MaskType::kPaddingCausalBottomRight;
}
bool mask_bottom_right(MaskType m, bool bottom_right_diagonal) {
  switch (m) {
    case MaskType::kCausal:
    case MaskType::kPaddingCausal:
      return false;
    case MaskType::kCausalBottomRight:
    case MaskType::kPaddingCausalBottomRight:
      return true;
    default:
      return bottom_right_diagonal;
  }
}

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kNotSupported:
      return "not supported";
    case ErrorCode::kBackendFailure:
      return "backend failure";
    case ErrorCode::kInternal:
      return "internal error";
    case ErrorCode::kIo:
      return "i/o error";
  }
  return "error";
}

std::string Error::compose(ErrorCode code, const std::string& argument,
                           const std::string& message) {
  std::string text = std::string("dpa ") + to_string(code);
  if (!argument.empty()) text += " (" + argument + ")";
  return text + ": " + message;
}

int64_t TensorView::numel() const {
  int64_t count = 1;
  for (int d = 0; d < ndim; ++d) count *= shape[d];
  return count;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string TensorView::shape_string() const {
  std::string text = "[";
  for (int d = 0; d < ndim; ++d) text += (d ? ", " : "") + std::to_string(shape[d]);
  return text + "]";
}

TensorView TensorView::contiguous(void* data, DType dtype, const int64_t* shape, int ndim,
                                  Device device) {
  if (ndim < 0 || ndim > kMaxDims)
    throw Error(ErrorCode::kInvalidArgument, "ndim", "at most 5 dimensions are supported");
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  view.ndim = ndim;
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    view.shape[d] = shape[d];
    view.strides[d] = stride;
    stride *= shape[d];
  }
  return view;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  return contiguous(data, dtype, shape.begin(), int(shape.size()), device);
}

}  // namespace dpa
