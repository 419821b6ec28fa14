// `dpa explain`: which backend a call with these shapes and options would use, and why every
// other backend would not. Builds TensorViews with null data: nothing is allocated or read.
#include <iostream>

#include "cli_args.h"
#include "cli_commands.h"
#include "cli_config.h"
#include "cli_errors.h"
#include "dpa/attention.h"

namespace dpa::cli {

namespace {

std::vector<FlagSpec> explain_flag_specs() {
  std::vector<FlagSpec> specs = {
      {"shape-q", "DIMS", "q shape: b,sq,H,dqk (bshd), sq,b,H,dqk (sbhd) or tq,H,dqk (thd)"},
      {"shape-k", "DIMS", "k shape, like q with skv and G"},
      {"shape-v", "DIMS", "v shape, like k with dv"},
      {"batch", "N", "thd: number of sequences (cu_seqlens are [N+1])"},
      {"dtype", "T", "float32 (default), float16, bfloat16 or float64"},
      {"device", "D", "cpu (default) or cuda"},
      {"pass", "P", "forward (default) or backward"},
      {"bias-shape", "DIMS", "a bias of this shape (b|1,H|1,sq|1,skv), dtype of q"},
      {"has-softmax-offset", "",
       "learnable sink logits fp32 [H] (implies --softmax-type learnable)"},
      {"has-alibi-slopes", "", "ALiBi slopes fp32 [H]"},
      {"mask-shape", "DIMS", "--mask arbitrary: mask shape (default 1,1,sq,skv)"},
      {"has-padded-offsets", "", "thd: sequences stored with gaps (cu_seqlens_*_padded)"},
  };
  for (FlagSpec& spec : config_flag_specs()) specs.push_back(std::move(spec));
  return specs;
}

std::string explain_usage() {
  return "usage: dpa explain --shape-q DIMS --shape-k DIMS --shape-v DIMS [options]\n"
         "\n"
         "Prints the backend DotProductAttention would choose for these shapes and options,\n"
         "and every backend's reasons. No data is read; tensor contents do not matter.\n"
         "\n"
         "options:\n" +
         format_flags(explain_flag_specs()) +
         "\n"
         "exit status: 0 when the explanation was printed (even if no backend is eligible);\n"
         "2 bad flags or invalid shapes; 1 other failures.\n";
}

TensorView null_view(DType dtype, Device device, const std::vector<int64_t>& shape,
                     const char* flag) {
  if (shape.empty() || int(shape.size()) > kMaxDims) {
    throw UsageError(flag, std::string("--") + flag + ": expected 1 to " +
                               std::to_string(kMaxDims) + " dimensions");
  }
  for (int64_t extent : shape) {
    if (extent < 0) {
      throw UsageError(flag, std::string("--") + flag + ": dimensions must be >= 0");
    }
  }
  return TensorView::contiguous(nullptr, dtype, shape.data(), int(shape.size()), device);
}

std::vector<int64_t> shape_flag(const ParsedArgs& args, const char* flag, int rank) {
  return *args.get_int_list(flag, rank);
}

int run_explain(const std::vector<std::string>& words) {
  const std::vector<FlagSpec> specs = explain_flag_specs();
  ParsedArgs args = parse_args(specs, words);
  if (args.help_requested()) {
    std::cout << explain_usage();
    return kExitOk;
  }
  args.require("shape-q");
  args.require("shape-k");
  args.require("shape-v");
  const AttentionConfig config =
      parse_config(args, args.has("has-softmax-offset"), args.has("bias-shape"));
  const bool thd = config.format == Format::kTHD;
  const int rank = thd ? 3 : 4;

  DType dtype = DType::kFloat32;
  if (auto name = args.get("dtype")) {
    auto parsed = parse_dtype(*name);
    if (!parsed || !is_floating(*parsed)) {
      throw UsageError(
          "dtype", "--dtype: expected float32, float16, bfloat16 or float64, got '" + *name + "'");
    }
    dtype = *parsed;
  }
  Device device = Device::kCPU;
  if (auto name = args.get("device")) {
    if (*name == "cuda") {
      device = Device::kCUDA;
    } else if (*name != "cpu") {
      throw UsageError("device", "--device: expected cpu or cuda, got '" + *name + "'");
    }
  }
  Pass pass = Pass::kForward;
  if (auto name = args.get("pass")) {
    if (*name == "backward") {
      pass = Pass::kBackward;
    } else if (*name != "forward") {
      throw UsageError("pass", "--pass: expected forward or backward, got '" + *name + "'");
    }
  }

  const std::vector<int64_t> q_shape = shape_flag(args, "shape-q", rank);
  const std::vector<int64_t> k_shape = shape_flag(args, "shape-k", rank);
  const std::vector<int64_t> v_shape = shape_flag(args, "shape-v", rank);
  AttentionInputs in;
  in.q = null_view(dtype, device, q_shape, "shape-q");
  in.k = null_view(dtype, device, k_shape, "shape-k");
  in.v = null_view(dtype, device, v_shape, "shape-v");

  // Sequence metadata: thd always needs cu_seqlens; bshd/sbhd padding masks get them too,
  // since that is how padded batches arrive. explain() reads shapes only, never contents.
  int64_t batch = 0;
  if (thd) {
    batch = args.get_int("batch").value_or(-1);
    if (batch < 1) {
      throw UsageError("batch", "--batch N (N >= 1) is required with --format thd");
    }
  } else {
    if (args.has("batch")) throw UsageError("batch", "--batch is only used with --format thd");
    batch = config.format == Format::kBSHD ? q_shape[0] : q_shape[1];
  }
  const int64_t heads = thd ? q_shape[1] : q_shape[2];
  const int64_t seqlen_q =
      thd ? q_shape[0] : (config.format == Format::kBSHD ? q_shape[1] : q_shape[0]);
  const int64_t seqlen_kv =
      thd ? k_shape[0] : (config.format == Format::kBSHD ? k_shape[1] : k_shape[0]);
  // The library reads cu_seqlens on the host (even for device tensors).
  if (thd || mask_is_padding(config.mask_type)) {
    const std::vector<int64_t> cu_shape = {batch + 1};
    const Device host = Device::kCPU;
    in.cu_seqlens_q = null_view(DType::kInt32, host, cu_shape, "batch");
    in.cu_seqlens_kv = null_view(DType::kInt32, host, cu_shape, "batch");
    if (args.has("has-padded-offsets")) {
      in.cu_seqlens_q_padded = null_view(DType::kInt32, host, cu_shape, "has-padded-offsets");
      in.cu_seqlens_kv_padded = null_view(DType::kInt32, host, cu_shape, "has-padded-offsets");
    }
  } else if (args.has("has-padded-offsets")) {
    throw UsageError("has-padded-offsets", "--has-padded-offsets is only used with --format thd");
  }

  if (auto bias_shape = args.get_int_list("bias-shape", 4)) {
    in.bias = null_view(dtype, device, *bias_shape, "bias-shape");
  }
  if (args.has("has-softmax-offset")) {
    in.softmax_offset = null_view(DType::kFloat32, device, {heads}, "has-softmax-offset");
  }
  if (args.has("has-alibi-slopes")) {
    in.alibi_slopes = null_view(DType::kFloat32, device, {heads}, "has-alibi-slopes");
  }
  if (auto mask_shape = args.get_int_list("mask-shape", 4)) {
    in.attn_mask = null_view(DType::kBool, device, *mask_shape, "mask-shape");
  } else if (config.mask_type == MaskType::kArbitrary) {
    in.attn_mask = null_view(DType::kBool, device, {1, 1, seqlen_q, seqlen_kv}, "mask-shape");
  }

  DotProductAttention attention(config);
  // The attention command asks for every gradient it can: do the same here.
  const bool backward = pass == Pass::kBackward;
  Selection selection = attention.explain(in, pass, backward && in.bias.defined(),
                                          backward && in.softmax_offset.defined());
  std::cout << selection.to_string();
  if (!selection.to_string().empty() && selection.to_string().back() != '\n') std::cout << "\n";
  return kExitOk;
}

}  // namespace

int explain_command(const std::vector<std::string>& words) {
  return run_guarded("explain", explain_flag, [&] { return run_explain(words); });
}

}  // namespace dpa::cli
