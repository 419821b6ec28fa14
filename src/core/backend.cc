// The capability declaration every full-spec backend starts from.
#include "core/backend.h"

namespace dpa {

Capabilities full_feature_capabilities(BackendKind kind, Device device) {
  Capabilities caps;
  caps.kind = kind;
  caps.device = device;
  caps.formats = {Format::kBSHD, Format::kSBHD, Format::kTHD};
  caps.mask_types = {
      MaskType::kNoMask,        MaskType::kPadding,           MaskType::kCausal,
      MaskType::kPaddingCausal, MaskType::kCausalBottomRight, MaskType::kPaddingCausalBottomRight,
      MaskType::kArbitrary};
  caps.window = true;
  caps.padded_offsets = true;
  caps.bias_types = {BiasType::kNoBias, BiasType::kPreScale, BiasType::kPostScale};
  caps.bias_grad = true;
  caps.alibi = true;
  caps.softcap = true;
  caps.softmax_types = {SoftmaxType::kVanilla, SoftmaxType::kOffByOne, SoftmaxType::kLearnable};
  caps.sink_grad = true;
  caps.dropout = true;
  caps.backward = true;
  caps.deterministic = true;
  return caps;
}

}  // namespace dpa
