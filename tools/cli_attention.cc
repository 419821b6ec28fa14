// `dpa attention`: one forward (and optionally backward) call on tensors read from .npy files.
#include <iostream>
#include <optional>

#include "cli_args.h"
#include "cli_commands.h"
#include "cli_config.h"
#include "cli_errors.h"
#include "cli_output.h"
#include "cli_tensors.h"
#include "dpa/attention.h"
#include "npy.h"

namespace dpa::cli {

namespace {

std::vector<FlagSpec> attention_flag_specs() {
  std::vector<FlagSpec> specs = {
      {"q", "Q.npy", "queries: bshd [b, sq, H, dqk], sbhd [sq, b, H, dqk], thd [tq, H, dqk]"},
      {"k", "K.npy", "keys: like q with skv and G heads (H % G == 0)"},
      {"v", "V.npy", "values: like k with dv"},
      {"out", "DIR", "output directory (created after everything was computed)"},
      {"do", "DO.npy", "output gradient (like o); runs the backward pass too"},
      {"cu-seqlens-q", "F",
       "int32 [b+1]: thd sequence boundaries; bshd/sbhd per-sequence lengths (padding)"},
      {"cu-seqlens-kv", "F", "int32 [b+1]: the same for k/v"},
      {"cu-seqlens-q-padded", "F",
       "int32 [b+1]: thd start of each q sequence when stored with gaps"},
      {"cu-seqlens-kv-padded", "F", "int32 [b+1]: the same for k/v"},
      {"attn-mask", "F", "bool/uint8 [b|1, H|1, sq, skv], true = masked (--mask arbitrary)"},
      {"bias", "F", "bias [b|1, H|1, sq|1, skv] (see --bias-type)"},
      {"alibi-slopes", "F", "ALiBi slopes, fp32 [H] or [b, H] (fp64 is converted)"},
      {"softmax-offset", "F",
       "learnable sink logits alpha, fp32 [H] (fp64 is converted); implies --softmax-type "
       "learnable"},
  };
  for (FlagSpec& spec : config_flag_specs()) specs.push_back(std::move(spec));
  return specs;
}

std::string attention_usage() {
  return "usage: dpa attention --q Q.npy --k K.npy --v V.npy --out DIR [--do DO.npy] [options]\n"
         "\n"
         "Runs DotProductAttention forward (and backward with --do) on .npy inputs\n"
         "(float16/float32/float64) and writes to DIR:\n"
         "  o.npy    layout and dtype of q, head dim of v\n"
         "  lse.npy  float32 [b, H, sq] (thd: [H, tq]), natural log, sink included\n"
         "  with --do: dq.npy, dk.npy, dv.npy (dtypes of q, k, v), dbias.npy (like the bias,\n"
         "  with --bias) and dsoftmax_offset.npy (float32 [H], with --softmax-offset)\n"
         "\n"
         "options:\n" +
         format_flags(attention_flag_specs()) +
         "\n"
         "exit status: 0 success; 2 bad flags or invalid input; 1 other failures.\n"
         "On error nothing is written into DIR.\n";
}

std::optional<npy::Array> load_optional(const ParsedArgs& args, const char* flag) {
  auto path = args.get(flag);
  if (!path) return std::nullopt;
  npy::Array array = npy::load(*path, flag);
  // The library reads a 0-d view as "not given": a given flag must never vanish that way.
  if (array.ndim() == 0)
    throw Error(ErrorCode::kInvalidArgument, flag,
                "'" + *path + "' holds a 0-d array; give it at least one dimension");
  return array;
}

// Slopes and sink logits are fp32 parameters; NumPy's default float64 is converted so that
// np.random.randn(H) works as is. Other dtypes go to the library, which names them.
std::optional<npy::Array> as_float32_parameter(std::optional<npy::Array> array) {
  if (array && (array->dtype == DType::kFloat64 || array->dtype == DType::kFloat16)) {
    return convert(*array, DType::kFloat32);
  }
  return array;
}

void check_rank(const npy::Array& array, const char* flag, Format format, const char* layout) {
  if (array.ndim() != qkv_rank(format)) {
    throw UsageError(flag, std::string("--") + flag + ": expected a " +
                               std::to_string(qkv_rank(format)) + "-d array " + layout + " for " +
                               std::string(to_string(format)) + ", got shape " +
                               array.shape_string());
  }
}

const char* layout_of(Format format, char tensor) {
  switch (format) {
    case Format::kBSHD:
      return tensor == 'q' ? "[b, sq, H, dqk]" : "[b, skv, G, d]";
    case Format::kSBHD:
      return tensor == 'q' ? "[sq, b, H, dqk]" : "[skv, b, G, d]";
    case Format::kTHD:
      return tensor == 'q' ? "[tq, H, dqk]" : "[tkv, G, d]";
  }
  return "";
}

int run_attention(const std::vector<std::string>& words) {
  const std::vector<FlagSpec> specs = attention_flag_specs();
  ParsedArgs args = parse_args(specs, words);
  if (args.help_requested()) {
    std::cout << attention_usage();
    return kExitOk;
  }
  // Everything the command needs is checked before any file is read.
  const std::string q_path = args.require("q");
  const std::string k_path = args.require("k");
  const std::string v_path = args.require("v");
  const std::string out_dir = args.require("out");
  const AttentionConfig config = parse_config(args, args.has("softmax-offset"), args.has("bias"));
  const RngState rng = parse_rng(args);
  std::vector<std::string> outputs_named = {"o.npy", "lse.npy"};
  if (args.has("do")) {
    for (const char* name : {"dq.npy", "dk.npy", "dv.npy"}) outputs_named.push_back(name);
    if (args.has("bias")) outputs_named.push_back("dbias.npy");
    if (args.has("softmax-offset")) outputs_named.push_back("dsoftmax_offset.npy");
  }
  OutputFiles::check_directory(out_dir, outputs_named);

  npy::Array q = npy::load(q_path, "q");
  npy::Array k = npy::load(k_path, "k");
  npy::Array v = npy::load(v_path, "v");
  std::optional<npy::Array> d_o = load_optional(args, "do");
  std::optional<npy::Array> cu_seqlens_q = load_optional(args, "cu-seqlens-q");
  std::optional<npy::Array> cu_seqlens_kv = load_optional(args, "cu-seqlens-kv");
  std::optional<npy::Array> cu_seqlens_q_padded = load_optional(args, "cu-seqlens-q-padded");
  std::optional<npy::Array> cu_seqlens_kv_padded = load_optional(args, "cu-seqlens-kv-padded");
  std::optional<npy::Array> attn_mask = load_optional(args, "attn-mask");
  std::optional<npy::Array> bias = load_optional(args, "bias");
  std::optional<npy::Array> alibi_slopes =
      as_float32_parameter(load_optional(args, "alibi-slopes"));
  std::optional<npy::Array> softmax_offset =
      as_float32_parameter(load_optional(args, "softmax-offset"));

  check_rank(q, "q", config.format, layout_of(config.format, 'q'));
  check_rank(k, "k", config.format, layout_of(config.format, 'k'));
  check_rank(v, "v", config.format, layout_of(config.format, 'k'));

  AttentionInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  if (cu_seqlens_q) in.cu_seqlens_q = cu_seqlens_q->view();
  if (cu_seqlens_kv) in.cu_seqlens_kv = cu_seqlens_kv->view();
  if (cu_seqlens_q_padded) in.cu_seqlens_q_padded = cu_seqlens_q_padded->view();
  if (cu_seqlens_kv_padded) in.cu_seqlens_kv_padded = cu_seqlens_kv_padded->view();
  if (attn_mask) in.attn_mask = attn_mask->view();
  if (bias) in.bias = bias->view();
  if (alibi_slopes) in.alibi_slopes = alibi_slopes->view();
  if (softmax_offset) in.softmax_offset = softmax_offset->view();

  npy::Array o(q.dtype, output_shape(q.shape, v.shape));
  npy::Array lse(DType::kFloat32, lse_shape(config.format, q.shape));

  DotProductAttention attention(config);
  ForwardArgs forward_args;
  forward_args.in = in;
  forward_args.o = o.view();
  forward_args.lse = lse.view();
  forward_args.rng = rng;
  const ForwardResult forward = attention.forward(forward_args);

  OutputFiles outputs;
  outputs.add("o.npy", o);
  outputs.add("lse.npy", lse);
  std::string summary = "forward on " + std::string(to_string(forward.backend));

  if (d_o) {
    npy::Array dq(q.dtype, q.shape), dk(k.dtype, k.shape), dv(v.dtype, v.shape);
    std::optional<npy::Array> dbias, dsoftmax_offset;
    BackwardArgs backward_args =
        backward_args_for(forward_args, forward, d_o->view(), dq.view(), dk.view(), dv.view());
    if (bias) {
      dbias.emplace(bias->dtype, bias->shape);
      backward_args.dbias = dbias->view();
    }
    if (softmax_offset) {
      dsoftmax_offset.emplace(DType::kFloat32, softmax_offset->shape);
      backward_args.dsoftmax_offset = dsoftmax_offset->view();
    }
    const BackendKind backward_backend = attention.backward(backward_args);
    outputs.add("dq.npy", dq);
    outputs.add("dk.npy", dk);
    outputs.add("dv.npy", dv);
    if (dbias) outputs.add("dbias.npy", *dbias);
    if (dsoftmax_offset) outputs.add("dsoftmax_offset.npy", *dsoftmax_offset);
    summary += ", backward on " + std::string(to_string(backward_backend));
  }

  outputs.write_all(out_dir);
  summary += "; wrote";
  for (const std::string& name : outputs.names()) summary += " " + name;
  std::cout << "dpa attention: " << summary << " to " << out_dir << "\n";
  return kExitOk;
}

}  // namespace

int attention_command(const std::vector<std::string>& words) {
  return run_guarded("attention", attention_flag, [&] { return run_attention(words); });
}

}  // namespace dpa::cli
