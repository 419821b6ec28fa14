// `dpa run`: the demo. Runs layers shaped like Gemma 2 (soft-cap, GQA, alternating sliding
// window and global causal) and gpt-oss (learnable sinks, banded window, GQA) forward and
// backward on the backend the selector picks, reports time and GFLOP/s, and checks each
// layer against cpu_exact on a sub-problem.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <random>
#include <thread>

#include "cli_args.h"
#include "cli_commands.h"
#include "cli_config.h"
#include "cli_device.h"
#include "cli_errors.h"
#include "cli_tensors.h"
#include "core/attention_math.h"
#include "dpa/attention.h"

namespace dpa::cli {

namespace {

struct LayerSpec {
  const char* model;  // "gemma2", "gpt-oss"
  const char* kind;   // "local", "global"
  int64_t heads_q, heads_kv, head_dim;
  int64_t window_left;  // -1: global causal
  double softcap;       // 0: off
  std::optional<double> scale;
  bool sinks;  // learnable softmax offsets
};

// Gemma 2 caps attention logits at 50 and alternates 4096-token sliding-window layers with
// global ones; gpt-oss alternates 128-token banded layers with dense ones, every layer with a
// learned sink per head. Head counts are scaled down to fit a laptop CPU.
// Gemma runs with scale 1 instead of 1/sqrt(d): with q, k ~ randn and d = 128 the logits then
// spread to +-40, where the cap of 50 bends them; at 1/sqrt(d) they would stay O(1) and the
// cap would change nothing (DESIGN.md §9, "inputs that hide the feature").
const LayerSpec kLayers[] = {
    {"gemma2", "local", 8, 4, 128, 512, 50.0, 1.0, false},
    {"gemma2", "global", 8, 4, 128, -1, 50.0, 1.0, false},
    {"gpt-oss", "local", 8, 2, 64, 128, 0.0, std::nullopt, true},
    {"gpt-oss", "global", 8, 2, 64, -1, 0.0, std::nullopt, true},
};
// Sink logits alpha ~ N(3, 2^2): big enough to take a visible share of each row's softmax
// next to 128..2048 keys (a zero sink would be invisible there).
constexpr double kSinkMean = 3.0, kSinkStddev = 2.0;

struct RunOptions {
  int64_t batch = 1;
  int64_t seqlen = 2048;
  int64_t check_len = 256;
  int repeat = 1;
  uint64_t seed = 2024;
  BackendKind backend = BackendKind::kAuto;
  Device device = Device::kCPU;
  DType dtype = DType::kFloat32;
};

// One layer's inputs, on the host.
struct Problem {
  AttentionConfig config;
  npy::Array q, k, v, d_o;    // bshd
  npy::Array softmax_offset;  // fp32 [H], with sinks
  bool sinks = false;
};

struct Outputs {
  npy::Array o, lse, dq, dk, dv, dsoftmax_offset;
  BackendKind forward_backend = BackendKind::kAuto, backward_backend = BackendKind::kAuto;
  double forward_seconds = 0, backward_seconds = 0;  // the median over repeats
  bool has_backward = false;
  std::string backward_skipped;  // why no backend can run the backward, when none can
};

std::vector<FlagSpec> run_flag_specs() {
  return {
      {"quick", "", "a short run (seqlen 512)"},
      {"seqlen", "N", "sequence length (default 2048 on the CPU, 8192 on a GPU)"},
      {"batch", "N", "batch size (default 1 on the CPU, 2 on a GPU)"},
      {"check-len", "N", "queries/keys of batch 0 checked against cpu_exact (default 256)"},
      {"repeat", "N", "timed repetitions, median reported (default 1 on the CPU, 10 on a GPU)"},
      {"seed", "N", "seed of the random inputs (default 2024)"},
      {"backend", "NAME", "force a backend instead of automatic selection"},
      {"device", "D", "auto (default: cuda when present), cpu or cuda"},
      {"dtype", "T", "float32 (CPU default), bfloat16 (GPU default), float16 or float64"},
  };
}

std::string run_usage() {
  return "usage: dpa run [--quick] [options]\n"
         "\n"
         "Demo: Gemma-2-like layers (soft-cap 50, GQA 8/4, d 128; sliding window 512 and global\n"
         "causal) and gpt-oss-like layers (learnable sinks, GQA 8/2, d 64; window 128 and\n"
         "global causal), forward + backward on the backend the selector picks. Prints time,\n"
         "GFLOP/s (4*b*H*pairs*d forward, pairs = visible (query, key) pairs, so half of\n"
         "s^2 for causal; backward 2.5x) and the error against cpu_exact on a sub-problem.\n"
         "\n"
         "options:\n" +
         format_flags(run_flag_specs()) +
         "\n"
         "exit status: 0 when every check passes, 1 when one fails, 2 bad flags.\n";
}

double forward_flops(const Problem& p) {
  const int64_t batch = p.q.shape[0], seqlen = p.q.shape[1], heads = p.q.shape[2];
  const int64_t dqk = p.q.shape[3], dv = p.v.shape[3];
  // 2 flops per multiply-add, QK^T (dqk) and PV (dv): 4*b*H*pairs*d for dqk = dv = d.
  // The layers are top-left causal with a left window (or none).
  const int64_t pairs = visible_pairs(seqlen, seqlen, 0, p.config.window_left, 0);
  return 2.0 * double(batch * heads) * double(pairs) * double(dqk + dv);
}

Problem make_problem(const LayerSpec& spec, const RunOptions& options, std::mt19937_64& rng) {
  Problem p;
  p.config.format = Format::kBSHD;
  p.config.mask_type = MaskType::kCausal;
  p.config.window_left = spec.window_left;
  p.config.window_right = spec.window_left >= 0 ? 0 : -1;
  p.config.softcap = spec.softcap;
  p.config.scale = spec.scale;
  p.config.softmax_type = spec.sinks ? SoftmaxType::kLearnable : SoftmaxType::kVanilla;
  p.config.backend = options.backend;
  p.sinks = spec.sinks;
  const int64_t b = options.batch, s = options.seqlen, d = spec.head_dim;
  p.q = random_normal(options.dtype, {b, s, spec.heads_q, d}, rng);
  p.k = random_normal(options.dtype, {b, s, spec.heads_kv, d}, rng);
  p.v = random_normal(options.dtype, {b, s, spec.heads_kv, d}, rng);
  p.d_o = random_normal(options.dtype, {b, s, spec.heads_q, d}, rng);
  if (spec.sinks) {
    p.softmax_offset = random_normal(DType::kFloat32, {spec.heads_q}, rng, kSinkStddev, kSinkMean);
  }
  return p;
}

// The first `n` positions of batch 0 (bshd, contiguous: a prefix of the bytes), in `dtype`.
npy::Array leading_rows(const npy::Array& a, int64_t n, DType dtype) {
  npy::Array sub(a.dtype, {1, n, a.shape[2], a.shape[3]});
  std::copy_n(a.bytes.begin(), sub.bytes.size(), sub.bytes.begin());
  return sub.dtype == dtype ? sub : convert(sub, dtype);
}

Problem sub_problem(const Problem& p, int64_t n, DType dtype) {
  Problem sub = p;
  sub.q = leading_rows(p.q, n, dtype);
  sub.k = leading_rows(p.k, n, dtype);
  sub.v = leading_rows(p.v, n, dtype);
  sub.d_o = leading_rows(p.d_o, n, dtype);
  return sub;
}

// One line per backend: its first reason for refusing.
std::string summarize_rejections(const Selection& selection) {
  std::string text;
  for (const BackendVerdict& verdict : selection.verdicts) {
    if (!text.empty()) text += "; ";
    text += std::string(to_string(verdict.backend)) + ": " +
            (verdict.reasons.empty() ? "eligible" : verdict.reasons.front());
  }
  return text;
}

// Runs the forward on `forward_backend` and, when `backward`, the backward on
// `backward_backend` (kAuto: the selector's choice). A backward that no backend can run is
// skipped with its reasons rather than failing the demo (e.g. a GPU build whose one-kernel backward
// has not landed yet).
Outputs execute(const Problem& p, BackendKind forward_backend, BackendKind backward_backend,
                Device device, bool backward, int repeat) {
  AttentionConfig config = p.config;
  config.backend = forward_backend;
  DotProductAttention attention(config);
  config.backend = backward_backend;
  DotProductAttention attention_backward(config);
  DeviceArray q(p.q, device), k(p.k, device), v(p.v, device), d_o(p.d_o, device);
  DeviceArray o(p.q.dtype, output_shape(p.q.shape, p.v.shape), device);
  DeviceArray lse(DType::kFloat32, lse_shape(Format::kBSHD, p.q.shape), device);
  std::optional<DeviceArray> softmax_offset, dsoftmax_offset;
  AttentionInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  if (p.sinks) {
    softmax_offset.emplace(p.softmax_offset, device);
    in.softmax_offset = softmax_offset->view();
  }
  ForwardArgs forward_args;
  forward_args.in = in;
  forward_args.o = o.view();
  forward_args.lse = lse.view();

  using Clock = std::chrono::steady_clock;
  auto median = [](std::vector<double> times) {
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  };
  // GPU timings exclude the first call (allocation, module loading).
  const int warmup = device == Device::kCPU ? 0 : 1;
  Outputs out;
  std::vector<double> times;
  ForwardResult forward;
  for (int r = 0; r < warmup + repeat; ++r) {
    auto start = Clock::now();
    forward = attention.forward(forward_args);
    synchronize(device);
    if (r >= warmup) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  out.forward_backend = forward.backend;
  out.forward_seconds = median(times);
  out.o = o.to_host();
  out.lse = lse.to_host();
  if (!backward) return out;
  Selection backward_selection = attention_backward.explain(in, Pass::kBackward, false, p.sinks);
  if (!backward_selection.chosen) {
    out.backward_skipped = summarize_rejections(backward_selection);
    return out;
  }

  DeviceArray dq(p.q.dtype, p.q.shape, device), dk(p.k.dtype, p.k.shape, device),
      dv(p.v.dtype, p.v.shape, device);
  BackwardArgs backward_args =
      backward_args_for(forward_args, forward, d_o.view(), dq.view(), dk.view(), dv.view());
  if (p.sinks) {
    dsoftmax_offset.emplace(DType::kFloat32, p.softmax_offset.shape, device);
    backward_args.dsoftmax_offset = dsoftmax_offset->view();
  }
  times.clear();
  for (int r = 0; r < warmup + repeat; ++r) {
    auto start = Clock::now();
    out.backward_backend = attention_backward.backward(backward_args);
    synchronize(device);
    if (r >= warmup) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  out.backward_seconds = median(times);
  out.has_backward = true;
  out.dq = dq.to_host();
  out.dk = dk.to_host();
  out.dv = dv.to_host();
  if (p.sinks) out.dsoftmax_offset = dsoftmax_offset->to_host();
  return out;
}

// Relative error a check may show: fp32 storage and accumulation versus the fp64 oracle, or
// the rounding of 16-bit outputs.
double tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return 1e-9;
    case DType::kFloat32:
      return 1e-4;
    case DType::kFloat16:
      return 1e-2;
    default:
      return 3e-2;  // bfloat16: 8 bits of mantissa
  }
}

std::string format(const char* pattern, auto... values) {
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, pattern, values...);
  return buffer;
}

std::string describe(const LayerSpec& spec, const RunOptions& options) {
  std::string text = format("b=%lld s=%lld H=%lld G=%lld d=%lld, causal", (long long)options.batch,
                            (long long)options.seqlen, (long long)spec.heads_q,
                            (long long)spec.heads_kv, (long long)spec.head_dim);
  if (spec.window_left >= 0) text += format(", window %lld left", (long long)spec.window_left);
  if (spec.softcap > 0) text += format(", softcap %g", spec.softcap);
  if (spec.scale) text += format(", scale %g (not 1/sqrt(d))", *spec.scale);
  if (spec.sinks) text += format(", learnable sinks alpha ~ N(%g, %g^2)", kSinkMean, kSinkStddev);
  return text;
}

void progress(const std::string& line) {
  std::cout.flush();
  std::cerr << line << std::endl;
}

struct CheckLine {
  std::string text;
  double worst = 0;
};

// Compares every output of `got` with `reference` as "name max-abs/relative".
CheckLine compare_all(const Outputs& got, const Outputs& reference, bool sinks) {
  CheckLine line;
  auto add = [&](const char* name, const npy::Array& a, const npy::Array& b) {
    ErrorNorms e = compare(a, b);
    line.worst = std::max(line.worst, e.relative);
    line.text += format("%s %.1e/%.1e  ", name, e.max_abs, e.relative);
  };
  add("o", got.o, reference.o);
  add("lse", got.lse, reference.lse);
  if (!got.has_backward) return line;
  add("dq", got.dq, reference.dq);
  add("dk", got.dk, reference.dk);
  add("dv", got.dv, reference.dv);
  if (sinks) add("dalpha", got.dsoftmax_offset, reference.dsoftmax_offset);
  return line;
}

RunOptions parse_run_options(const ParsedArgs& args) {
  RunOptions options;
  const std::string device = args.get_or("device", "auto");
  std::string why_not_cuda;
  const int cuda_devices = cuda_device_count(&why_not_cuda);
  if (device == "auto") {
    options.device = cuda_devices > 0 ? Device::kCUDA : Device::kCPU;
  } else if (device == "cuda") {
    if (cuda_devices == 0) throw UsageError("device", "--device cuda: " + why_not_cuda);
    options.device = Device::kCUDA;
  } else if (device == "cpu") {
    options.device = Device::kCPU;
  } else {
    throw UsageError("device", "--device: expected auto, cpu or cuda, got '" + device + "'");
  }
  const bool gpu = options.device == Device::kCUDA;
  options.dtype = gpu ? DType::kBFloat16 : DType::kFloat32;
  options.seqlen = gpu ? 8192 : 2048;
  options.batch = gpu ? 2 : 1;
  options.repeat = gpu ? 10 : 1;
  if (args.has("quick")) options.seqlen = 512;
  if (auto dtype = args.get("dtype")) {
    auto parsed = parse_dtype(*dtype);
    if (!parsed || !is_floating(*parsed)) {
      throw UsageError(
          "dtype", "--dtype: expected float32, float16, bfloat16 or float64, got '" + *dtype + "'");
    }
    options.dtype = *parsed;
  }
  auto positive = [&](const char* flag, int64_t fallback, int64_t limit) {
    int64_t value = args.get_int(flag).value_or(fallback);
    if (value < 1 || value > limit) {
      throw UsageError(flag, std::string("--") + flag + " must be in [1, " + std::to_string(limit) +
                                 "], got " + std::to_string(value));
    }
    return value;
  };
  options.seqlen = positive("seqlen", options.seqlen, 1 << 20);
  options.batch = positive("batch", options.batch, 1 << 16);
  options.check_len = positive("check-len", options.check_len, 4096);
  options.repeat = int(positive("repeat", options.repeat, 1000));
  options.check_len = std::min(options.check_len, options.seqlen);
  options.seed = args.get_uint64("seed").value_or(options.seed);
  if (auto backend = args.get_named("backend", "backend", kBackendChoices, parse_backend))
    options.backend = *backend;
  return options;
}

int run_demo(const std::vector<std::string>& words) {
  ParsedArgs args = parse_args(run_flag_specs(), words);
  if (args.help_requested()) {
    std::cout << run_usage();
    return kExitOk;
  }
  const RunOptions options = parse_run_options(args);
  const auto run_start = std::chrono::steady_clock::now();
  const int layer_count = int(std::size(kLayers));

  std::cout << format("dpa run: %s tensors, %s, %u hardware threads, backend %s\n",
                      options.device == Device::kCPU ? "host" : "CUDA",
                      std::string(to_string(options.dtype)).c_str(),
                      std::thread::hardware_concurrency(),
                      options.backend == BackendKind::kAuto
                          ? "chosen by the selector"
                          : ("forced to " + std::string(to_string(options.backend))).c_str())
            << "GFLOP/s counts only visible (query, key) pairs: forward 4*b*H*pairs*d (causal "
               "~ half of s^2, windows fewer), backward 2.5x forward.\n"
            << format(
                   "Check: batch 0, first %lld queries/keys, same config, forward + backward "
                   "vs cpu_exact (max abs / relative error).\n\n",
                   (long long)options.check_len);

  std::mt19937_64 rng(options.seed);
  bool all_passed = true;
  double total_flops = 0, total_seconds = 0;
  for (int index = 0; index < layer_count; ++index) {
    const LayerSpec& spec = kLayers[index];
    const std::string tag =
        format("[%d/%d] %s %s layer", index + 1, layer_count, spec.model, spec.kind);
    Problem problem = make_problem(spec, options, rng);

    progress(tag + ": forward + backward ...");
    Outputs run =
        execute(problem, options.backend, options.backend, options.device, true, options.repeat);
    const double flops = forward_flops(problem);
    total_flops += (run.has_backward ? 3.5 : 1.0) * flops;
    total_seconds += run.forward_seconds + run.backward_seconds;

    // The check runs the chosen backends and the oracle on the same small problem. Causal rows
    // of a prefix see only that prefix, so it is a complete problem of its own. A window that
    // the prefix would not cut is narrowed so that the check exercises it.
    progress(tag + ": checking against cpu_exact ...");
    const int64_t n = options.check_len;
    Problem check = sub_problem(problem, n, options.dtype);
    std::string window_note;
    if (spec.window_left >= n) {
      check.config.window_left = std::max<int64_t>(1, n / 4);
      window_note = format(" (window %lld -> %lld so that it cuts rows of the check)",
                           (long long)spec.window_left, (long long)check.config.window_left);
    }
    Outputs got = execute(check, run.forward_backend, run.backward_backend, options.device,
                          run.has_backward, 1);
    // The oracle reads the same values on the host; 16-bit inputs go in exactly as fp32, so the
    // reference is not rounded to 16 bits on the way out.
    const DType reference_dtype =
        options.dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
    Problem reference_problem = sub_problem(problem, n, reference_dtype);
    reference_problem.config.window_left = check.config.window_left;
    Outputs reference = execute(reference_problem, BackendKind::kCpuExact, BackendKind::kCpuExact,
                                Device::kCPU, run.has_backward, 1);
    // How much the layer's feature moves the output, so that the check is known to see it.
    Problem plain = reference_problem;
    std::string feature;
    if (spec.softcap > 0) {
      plain.config.softcap = 0;
      feature = format("softcap %g moves", spec.softcap);
    } else {
      plain.config.softmax_type = SoftmaxType::kVanilla;
      plain.sinks = false;
      feature = "the sinks move";
    }
    Outputs without =
        execute(plain, BackendKind::kCpuExact, BackendKind::kCpuExact, Device::kCPU, false, 1);
    const double feature_effect = compare(without.o, reference.o).relative;
    const CheckLine line = compare_all(got, reference, spec.sinks);
    const bool passed = line.worst <= tolerance(options.dtype);
    all_passed = all_passed && passed;

    std::cout << tag << ": " << describe(spec, options) << "\n"
              << format("  forward   %-10s %9.3f s  %8.2f GFLOP/s\n",
                        std::string(to_string(run.forward_backend)).c_str(), run.forward_seconds,
                        flops / run.forward_seconds / 1e9)
              << (run.has_backward
                      ? format("  backward  %-10s %9.3f s  %8.2f GFLOP/s\n",
                               std::string(to_string(run.backward_backend)).c_str(),
                               run.backward_seconds, 2.5 * flops / run.backward_seconds / 1e9)
                      : "  backward  skipped, no backend can run it (" + run.backward_skipped +
                            ")\n")
              << "  check" << window_note << ": " << line.text << (passed ? "PASS" : "FAIL")
              << format(" (tolerance %.0e)\n", tolerance(options.dtype))
              << format("  %s o by %.1f%% on the check problem (so the check can see it)\n\n",
                        feature.c_str(), 100.0 * feature_effect);
  }

  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  std::cout << format(
                   "total: %.2f GFLOP in %.2f s of attention (%.2f GFLOP/s); %.1f s wall "
                   "including checks\n",
                   total_flops / 1e9, total_seconds, total_flops / total_seconds / 1e9, wall)
            << (all_passed ? "all checks passed\n" : "SOME CHECKS FAILED\n");
  return all_passed ? kExitOk : kExitFailure;
}

}  // namespace

int run_command(const std::vector<std::string>& words) {
  return run_guarded("run", attention_flag, [&] { return run_demo(words); });
}

}  // namespace dpa::cli
