#include "cli_config.h"

#include "dpa/types.h"

namespace dpa::cli {

std::vector<FlagSpec> config_flag_specs() {
  return {
      {"format", "FMT", "tensor layout: bshd (default), sbhd or thd"},
      {"mask", "TYPE",
       "no_mask (default), padding, causal, padding_causal, causal_bottom_right, "
       "padding_causal_bottom_right, arbitrary"},
      {"window", "L,R", "sliding window: keys i-L..i+R are visible; -1 is unbounded"},
      {"bottom-right-diagonal", "0|1",
       "diagonal alignment for no_mask/padding/arbitrary (default 1: bottom-right)"},
      {"softcap", "C", "logit soft-cap c*tanh(u/c); 0 (default) disables it"},
      {"scale", "S", "logit scale (default 1/sqrt(dqk))"},
      {"softmax-type", "T",
       "vanilla (default), off-by-one or learnable (sink logits from --softmax-offset)"},
      {"bias-type", "T", "pre_scale or post_scale (default post_scale when a bias is given)"},
      {"dropout", "P", "dropout probability in [0, 1) (default 0)"},
      {"seed", "N", "dropout RNG seed (default 0)"},
      {"offset", "N", "dropout RNG offset (default 0)"},
      {"deterministic", "", "ask for bit-identical results run to run"},
      {"layer-number", "L", "qk-layer-scaling factor (fp16 overflow guard); 0 or 1 = off"},
      {"backend", "NAME", "cpu_exact, cpu, cuda_unfused, cuda_flash or auto (default)"},
  };
}

AttentionConfig parse_config(const ParsedArgs& args, bool has_softmax_offset, bool has_bias) {
  AttentionConfig config;
  if (auto format = args.get_named("format", "format", "bshd, sbhd, thd", parse_format))
    config.format = *format;
  if (auto mask = args.get_named("mask", "mask type", kMaskChoices, parse_mask_type))
    config.mask_type = *mask;
  if (auto window = args.get_int_list("window", 2)) {
    config.window_left = (*window)[0];
    config.window_right = (*window)[1];
  }
  if (auto value = args.get("bottom-right-diagonal")) {
    if (*value != "0" && *value != "1") {
      throw UsageError("bottom-right-diagonal",
                       "--bottom-right-diagonal expects 0 or 1, got '" + *value + "'");
    }
    config.bottom_right_diagonal = *value == "1";
  }
  if (auto cap = args.get_double("softcap")) config.softcap = *cap;
  if (auto scale = args.get_double("scale")) config.scale = *scale;
  if (auto type =
          args.get_named("softmax-type", "softmax type", kSoftmaxTypeChoices, parse_softmax_type)) {
    config.softmax_type = *type;
  } else if (has_softmax_offset) {
    config.softmax_type = SoftmaxType::kLearnable;
  }
  if (auto type =
          args.get_named("bias-type", "bias type", "pre_scale, post_scale", parse_bias_type)) {
    config.bias_type = *type;
  } else if (has_bias) {
    config.bias_type = BiasType::kPostScale;
  }
  if (auto p = args.get_double("dropout")) config.dropout = *p;
  if (auto seed = args.get_uint64("seed")) config.seed = *seed;
  config.deterministic = args.has("deterministic");
  if (auto layer = args.get_int("layer-number")) {
    if (*layer < 0 || *layer > 1'000'000) {
      throw UsageError("layer-number", "--layer-number must be a non-negative layer index, got " +
                                           std::to_string(*layer));
    }
    config.layer_number = int(*layer);
  }
  if (auto backend = args.get_named("backend", "backend", kBackendChoices, parse_backend))
    config.backend = *backend;
  return config;
}

RngState parse_rng(const ParsedArgs& args) {
  RngState rng;
  if (auto seed = args.get_uint64("seed")) rng.seed = *seed;
  if (auto offset = args.get_uint64("offset")) rng.offset = *offset;
  return rng;
}

}  // namespace dpa::cli
