// `dpa bench`: times DotProductAttention on CUDA device tensors (DESIGN.md §10), or with
// --decode KvCacheAttention over a contiguous or paged cache. CUDA events around each call, the
// median of >= 20 runs after warm-up, TFLOP/s (forward 4*b*H*sq*skv*d, half for causal,
// backward 2.5x forward; windows count their visible pairs exactly) and, for decode-like
// shapes, GB/s. One line per configuration on stdout; --json writes them all.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_random.h"
#include "cli_args.h"
#include "cli_commands.h"
#include "cli_config.h"
#include "cli_errors.h"
#include "dpa/attention.h"
#include "dpa/kvcache.h"

#if defined(DPA_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "core/attention_math.h"
#include "core/float_convert.h"
#include "cuda/runtime.h"
#endif

namespace dpa::cli {

namespace {

constexpr const char* kDefaultShapes = "2,16,16,8192,8192,128";
constexpr int kMinIters = 20;

std::vector<FlagSpec> bench_flag_specs() {
  return {
      {"shapes", "LIST",
       "';'-separated b,H,G,sq,skv,d[,dv] (default " + std::string(kDefaultShapes) + ")"},
      {"causal", "", "causal mask (top-left; the same as --mask causal)"},
      {"mask", "NAME", "no_mask (default), causal, causal_bottom_right, ... (not arbitrary)"},
      {"softcap", "C", "soft-cap c * tanh(s / c) (default 0: off)"},
      {"softmax-type", "T", "vanilla (default), off-by-one or learnable (offsets ~ N(0, 2^2))"},
      {"window", "L,R", "sliding window; -1 is unbounded (default -1,-1)"},
      {"dropout", "P",
       "dropout probability in [0, 1) (default 0); the backward reuses the keep "
       "masks of the forward's RNG state"},
      {"deterministic", "", "ask for bit-identical results run to run (the selector honours it)"},
      {"decode", "",
       "time KvCacheAttention instead: sq queries per sequence over skv cached keys "
       "(bottom-right diagonal; --causal, --window, --softcap, --softmax-type apply)"},
      {"page-size", "N", "with --decode: a paged cache of N-token pages (default: contiguous)"},
      {"append", "",
       "with --decode: the call first appends the sq queries' keys and values to a cache "
       "holding skv - sq, as a serving step does (k_new, v_new)"},
      {"varlen", "",
       "pack the b sequences into thd tensors with cu_seqlens (each one full length; a mask "
       "becomes its padding form)"},
      {"dtype", "T", "bf16 (default) or fp16"},
      {"pass", "P", "fwd (default), bwd or fwdbwd"},
      {"backend", "NAME", "force a backend (default: the selector's choice)"},
      {"flash-forward-kernel", "NAME",
       "cuda_flash's forward family: auto (default), mma_sync or wgmma_ws "
       "(AttentionConfig::flash_forward_kernel)"},
      {"flash-backward-kernel", "NAME",
       "cuda_flash's backward family: auto (default), mma_sync or one_kernel "
       "(AttentionConfig::flash_backward_kernel)"},
      {"graph", "",
       "time replays of a CUDA graph that captured one call (after an eager warm-up call): "
       "its kernels without the host's work, as a serving engine replays decode"},
      {"iters", "N", "timed runs, at least 20 (default 30); the median is reported"},
      {"warmup", "N", "untimed runs before timing (default 5)"},
      {"seed", "N", "seed of the random inputs (default 1)"},
      {"pad-mib", "N",
       "hold N MiB of device memory before anything else is allocated, so that the inputs and "
       "the library's workspace land elsewhere in device memory (default 0): a diagnostic for "
       "timings that move with where the buffers lie"},
      {"label", "TEXT", "a name for this configuration in the output"},
      {"json", "FILE", "also write the results as a JSON list of objects"},
  };
}

std::string bench_usage() {
  return "usage: dpa bench [options]\n"
         "\n"
         "Times DotProductAttention on CUDA device tensors with random inputs: CUDA events\n"
         "around each call (validation and selection included), the median of the timed runs\n"
         "after warm-up. TFLOP/s per DESIGN.md §10: forward 2*b*H*pairs*(dqk+dv), pairs =\n"
         "sq*skv (half of it for a causal mask with sq = skv; counted exactly with a window or\n"
         "another causal shape); backward 2.5x, fwdbwd 3.5x the forward. For sq <= 16 also\n"
         "GB/s: the bytes of q, k, v and o, each moved once. With --decode, KvCacheAttention\n"
         "over a cache of skv keys per sequence (shuffled pages with --page-size), GB/s\n"
         "counting the keys the queries can see (a window bounds them).\n"
         "\n"
         "options:\n" +
         format_flags(bench_flag_specs()) +
         "\n"
         "example: dpa bench --shapes '2,16,16,8192,8192,128;2,64,8,1,32768,128' --softcap 50\n"
         "         dpa bench --decode --causal --page-size 16 --shapes '16,64,8,1,32768,128'\n"
         "exit status: 0 every configuration ran, 1 one failed (reported, the others still\n"
         "run), 2 bad flags or a build without CUDA.\n";
}

struct BenchShape {
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_kv, head_dim_qk, head_dim_v;
  std::string text() const {
    std::string s = std::to_string(batch) + "," + std::to_string(heads_q) + "," +
                    std::to_string(heads_kv) + "," + std::to_string(seqlen_q) + "," +
                    std::to_string(seqlen_kv) + "," + std::to_string(head_dim_qk);
    if (head_dim_v != head_dim_qk) s += "," + std::to_string(head_dim_v);
    return s;
  }
};

enum class BenchPass { kForward, kBackward, kForwardBackward };

struct BenchOptions {
  std::vector<BenchShape> shapes;
  AttentionConfig config;
  DType dtype = DType::kBFloat16;
  BenchPass pass = BenchPass::kForward;
  bool decode = false;    // KvCacheAttention over a cache
  bool varlen = false;    // thd tensors with cu_seqlens (config.format is kTHD)
  int64_t page_size = 0;  // --decode: 0 contiguous
  bool append = false;    // --decode: the call appends sq keys and values first
  bool graph = false;     // time CUDA-graph replays of one captured call
  int iters = 30;
  int warmup = 5;
  uint64_t seed = 1;
  int64_t pad_mib = 0;
  std::string label;
  std::optional<std::string> json_path;
};

std::vector<BenchShape> parse_shapes(const std::string& text) {
  std::vector<BenchShape> shapes;
  std::string item;
  std::istringstream stream(text);
  while (std::getline(stream, item, ';')) {
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    std::vector<int64_t> values;
    std::istringstream fields(item);
    std::string field;
    while (std::getline(fields, field, ',')) {
      const size_t first = field.find_first_not_of(" \t");
      const size_t last = field.find_last_not_of(" \t");
      values.push_back(parse_int(
          first == std::string::npos ? "" : field.substr(first, last - first + 1), "shapes"));
    }
    if (values.size() != 6 && values.size() != 7)
      throw UsageError("shapes", "--shapes: each shape is b,H,G,sq,skv,d[,dv], got '" + item + "'");
    for (int64_t v : values)
      if (v <= 0) throw UsageError("shapes", "--shapes: sizes must be positive in '" + item + "'");
    shapes.push_back({values[0], values[1], values[2], values[3], values[4], values[5],
                      values.size() == 7 ? values[6] : values[5]});
  }
  if (shapes.empty()) throw UsageError("shapes", "--shapes: no shape given");
  return shapes;
}

BenchOptions parse_bench_options(const ParsedArgs& args) {
  BenchOptions o;
  o.shapes = parse_shapes(args.get_or("shapes", kDefaultShapes));
  if (args.has("causal") && args.has("mask"))
    throw UsageError("causal", "--causal and --mask are exclusive");
  if (args.has("causal")) o.config.mask_type = MaskType::kCausal;
  if (auto mask = args.get_named("mask", "mask type", kMaskChoices, parse_mask_type)) {
    if (*mask == MaskType::kArbitrary)
      throw UsageError("mask", "--mask arbitrary needs a mask tensor; bench does not make one");
    o.config.mask_type = *mask;
  }
  if (auto cap = args.get_double("softcap")) o.config.softcap = *cap;
  if (auto type =
          args.get_named("softmax-type", "softmax type", kSoftmaxTypeChoices, parse_softmax_type))
    o.config.softmax_type = *type;
  if (auto window = args.get_int_list("window", 2)) {
    o.config.window_left = (*window)[0];
    o.config.window_right = (*window)[1];
  }
  if (auto p = args.get_double("dropout")) {
    if (!(*p >= 0.0 && *p < 1.0))
      throw UsageError("dropout", "--dropout: a probability in [0, 1), got '" +
                                      args.get_or("dropout", "") + "'");
    o.config.dropout = *p;
  }
  o.config.deterministic = args.has("deterministic");
  const std::string dtype = args.get_or("dtype", "bf16");
  auto parsed = parse_dtype(dtype);
  if (!parsed || (*parsed != DType::kBFloat16 && *parsed != DType::kFloat16))
    throw UsageError("dtype", "--dtype: bf16 or fp16, got '" + dtype + "'");
  o.dtype = *parsed;
  const std::string pass = args.get_or("pass", "fwd");
  if (pass == "fwd")
    o.pass = BenchPass::kForward;
  else if (pass == "bwd")
    o.pass = BenchPass::kBackward;
  else if (pass == "fwdbwd")
    o.pass = BenchPass::kForwardBackward;
  else
    throw UsageError("pass", "--pass: fwd, bwd or fwdbwd, got '" + pass + "'");
  if (auto backend = args.get_named("backend", "backend", kBackendChoices, parse_backend))
    o.config.backend = *backend;
  if (auto kernel = args.get_named("flash-forward-kernel", "kernel family",
                                   "auto, mma_sync, wgmma_ws", parse_flash_forward_kernel))
    o.config.flash_forward_kernel = *kernel;
  if (auto kernel = args.get_named("flash-backward-kernel", "kernel family",
                                   "auto, mma_sync, one_kernel", parse_flash_backward_kernel))
    o.config.flash_backward_kernel = *kernel;
  if (auto iters = args.get_int("iters")) {
    if (*iters < kMinIters)
      throw UsageError("iters", "--iters: at least " + std::to_string(kMinIters) + " runs");
    o.iters = int(*iters);
  }
  if (auto warmup = args.get_int("warmup")) {
    if (*warmup < 0) throw UsageError("warmup", "--warmup must be >= 0");
    o.warmup = int(*warmup);
  }
  if (auto seed = args.get_uint64("seed")) o.seed = *seed;
  if (auto pad = args.get_int("pad-mib")) {
    if (*pad < 0 || *pad > (int64_t(1) << 20))
      throw UsageError("pad-mib", "--pad-mib: 0 to 1048576 MiB");
    o.pad_mib = *pad;
  }
  o.decode = args.has("decode");
  o.graph = args.has("graph");
  if (auto page = args.get_int("page-size")) {
    if (!o.decode) throw UsageError("page-size", "--page-size needs --decode");
    if (*page < 1 || *page > 256 || (*page & (*page - 1)) != 0)
      throw UsageError("page-size", "--page-size: a power of two from 1 to 256");
    o.page_size = *page;
  }
  o.append = args.has("append");
  if (o.append && !o.decode) throw UsageError("append", "--append needs --decode");
  if (o.decode) {
    const MaskType mask = o.config.mask_type;
    if (mask != MaskType::kNoMask && mask != MaskType::kCausal &&
        mask != MaskType::kCausalBottomRight)
      throw UsageError("mask", "--decode: no mask or causal (bottom-right), got --mask " +
                                   std::string(to_string(mask)));
    if (o.pass != BenchPass::kForward)
      throw UsageError("pass", "--decode: the KV-cache call has only a forward");
    if (o.config.dropout > 0) throw UsageError("dropout", "--decode: no dropout at inference");
    if (o.config.deterministic)
      throw UsageError("deterministic", "--decode: the forward is deterministic already");
    // The call's diagonal is bottom-right: say so in the output.
    if (mask == MaskType::kCausal) o.config.mask_type = MaskType::kCausalBottomRight;
    if (o.append)
      for (const BenchShape& shape : o.shapes)
        if (shape.seqlen_q > shape.seqlen_kv)
          throw UsageError("append", "--append: sq must not exceed skv in " + shape.text());
  }
  o.varlen = args.has("varlen");
  if (o.varlen) {
    if (o.decode) throw UsageError("varlen", "--varlen and --decode are exclusive");
    // thd takes the padding forms of the masks (cu_seqlens say where each sequence ends).
    const MaskType mask = o.config.mask_type;
    o.config.mask_type = mask == MaskType::kCausal ? MaskType::kPaddingCausal
                         : mask == MaskType::kCausalBottomRight
                             ? MaskType::kPaddingCausalBottomRight
                         : mask == MaskType::kNoMask ? MaskType::kPadding
                                                     : mask;
    o.config.format = Format::kTHD;
  }
  o.label = args.get_or("label", "");
  o.json_path = args.get("json");
  return o;
}

#if defined(DPA_WITH_CUDA)

// Visible (query, key) pairs of one head (DESIGN.md §3 visibility with full-length sequences).
int64_t bench_visible_pairs(const BenchShape& s, const AttentionConfig& c) {
  const int64_t right = mask_is_causal(c.mask_type) ? 0 : c.window_right;
  const int64_t diagonal =
      mask_bottom_right(c.mask_type, c.bottom_right_diagonal) ? s.seqlen_kv - s.seqlen_q : 0;
  return visible_pairs(s.seqlen_q, s.seqlen_kv, diagonal, c.window_left, right);
}

struct FlopCount {
  double forward = 0;
  std::string method;
};

FlopCount forward_flops(const BenchShape& s, const AttentionConfig& c) {
  const double dense = 2.0 * double(s.batch * s.heads_q) * double(s.seqlen_q) *
                       double(s.seqlen_kv) * double(s.head_dim_qk + s.head_dim_v);
  const bool window = c.window_left >= 0 || (!mask_is_causal(c.mask_type) && c.window_right >= 0);
  const bool causal = mask_is_causal(c.mask_type);
  if (!window && !causal) return {dense, "dense: 4*b*H*sq*skv*d"};
  if (!window && s.seqlen_q == s.seqlen_kv)
    return {dense / 2, "causal: half of 4*b*H*sq*skv*d (DESIGN.md 10)"};
  const double pairs = double(bench_visible_pairs(s, c));
  return {2.0 * double(s.batch * s.heads_q) * pairs * double(s.head_dim_qk + s.head_dim_v),
          "visible pairs counted exactly: 2*b*H*pairs*(dqk+dv)"};
}

double pass_factor(BenchPass pass) {
  switch (pass) {
    case BenchPass::kForward:
      return 1.0;
    case BenchPass::kBackward:
      return 2.5;
    case BenchPass::kForwardBackward:
      return 3.5;
  }
  return 1.0;
}

const char* pass_name(BenchPass pass) {
  switch (pass) {
    case BenchPass::kForward:
      return "fwd";
    case BenchPass::kBackward:
      return "bwd";
    case BenchPass::kForwardBackward:
      return "fwdbwd";
  }
  return "?";
}

struct BenchResult {
  BenchShape shape;
  std::string backend;
  double median_ms = 0, min_ms = 0;
  FlopCount flops;
  double tflops = 0;
  std::optional<double> gbps;
  std::string error;
};

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\u%04x", ch);
      out += buffer;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream out;
  out.precision(6);
  out << value;
  return out.str();
}

std::string to_json(const BenchOptions& o, const BenchResult& r, const std::string& device) {
  const AttentionConfig& c = o.config;
  std::ostringstream j;
  j << "{\"label\": " << json_string(o.label) << ", \"config\": {\"b\": " << r.shape.batch
    << ", \"H\": " << r.shape.heads_q << ", \"G\": " << r.shape.heads_kv
    << ", \"sq\": " << r.shape.seqlen_q << ", \"skv\": " << r.shape.seqlen_kv
    << ", \"dqk\": " << r.shape.head_dim_qk << ", \"dv\": " << r.shape.head_dim_v
    << ", \"dtype\": " << json_string(std::string(to_string(o.dtype)))
    << ", \"mask\": " << json_string(std::string(to_string(c.mask_type))) << ", \"window\": ["
    << c.window_left << ", " << c.window_right << "], \"softcap\": " << json_number(c.softcap)
    << ", \"softmax_type\": " << json_string(std::string(to_string(c.softmax_type)))
    << ", \"dropout\": " << json_number(c.dropout)
    << ", \"deterministic\": " << (c.deterministic ? "true" : "false")
    << ", \"pass\": " << json_string(pass_name(o.pass))
    << ", \"decode\": " << (o.decode ? "true" : "false") << ", \"page_size\": " << o.page_size
    << ", \"append\": " << (o.append ? "true" : "false")
    << ", \"graph\": " << (o.graph ? "true" : "false") << "}"
    << ", \"device\": " << json_string(device) << ", \"backend\": " << json_string(r.backend)
    << ", \"iters\": " << o.iters << ", \"warmup\": " << o.warmup;
  if (!r.error.empty()) {
    j << ", \"error\": " << json_string(r.error) << "}";
    return j.str();
  }
  j << ", \"median_ms\": " << json_number(r.median_ms) << ", \"min_ms\": " << json_number(r.min_ms)
    << ", \"flops\": " << json_number(r.flops.forward * pass_factor(o.pass))
    << ", \"flops_method\": " << json_string(r.flops.method)
    << ", \"tflops\": " << json_number(r.tflops)
    << ", \"gbps\": " << (r.gbps ? json_number(*r.gbps) : "null") << "}";
  return j.str();
}

std::string describe_config(const BenchOptions& o) {
  const AttentionConfig& c = o.config;
  std::string text = std::string(to_string(o.dtype)) + " " + pass_name(o.pass);
  if (o.decode)
    text += o.page_size > 0 ? " decode paged=" + std::to_string(o.page_size) : " decode contiguous";
  if (o.append) text += " append";
  if (o.varlen) text += " thd";
  if (o.graph) text += " graph";
  if (c.mask_type != MaskType::kNoMask) text += " " + std::string(to_string(c.mask_type));
  if (c.window_left >= 0 || c.window_right >= 0)
    text += " window=" + std::to_string(c.window_left) + "," + std::to_string(c.window_right);
  if (c.softcap > 0) text += " softcap=" + json_number(c.softcap);
  if (c.softmax_type != SoftmaxType::kVanilla)
    text += " sink=" + std::string(to_string(c.softmax_type));
  if (c.dropout > 0) text += " dropout=" + json_number(c.dropout);
  if (c.deterministic) text += " deterministic";
  return text;
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(ErrorCode::kBackendFailure, "",
                std::string(what) + " failed: " + cudaGetErrorString(status));
}

// A random tensor in device memory for one configuration.
class BenchTensor {
 public:
  BenchTensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    int64_t count = 1;
    for (int64_t extent : shape_) count *= extent;
    bytes_ = size_t(count) * dtype_size(dtype);
    memory_ = cuda::DeviceMemory(std::max<size_t>(bytes_, 16), 0);
  }

  TensorView view() const {
    return TensorView::contiguous(memory_.get(), dtype_, shape_.data(), int(shape_.size()),
                                  Device::kCUDA);
  }
  size_t bytes() const { return bytes_; }

  // Random values (not zeros: zeros would make the softmax uniform and could take fast paths):
  // an approximately normal N(0, stddev^2) draw per element (tools/bench_random.h), drawn on
  // every hardware thread.
  void fill_random(uint64_t seed, double stddev) {
    const size_t count = bytes_ / dtype_size(dtype_);
    const unsigned threads = std::thread::hardware_concurrency();
    // Not value-initialised: the threads' writes are the first touch of up to gigabytes.
    if (dtype_ == DType::kFloat32) {
      std::unique_ptr<float[]> host(new float[count]);
      tools::fill_normal(
          host.get(), count, seed, float(stddev), [](float x) { return x; }, threads);
      check(cudaMemcpy(memory_.get(), host.get(), bytes_, cudaMemcpyHostToDevice), "cudaMemcpy");
      return;
    }
    std::unique_ptr<uint16_t[]> host(new uint16_t[count]);
    if (dtype_ == DType::kBFloat16) {
      tools::fill_normal(host.get(), count, seed, float(stddev), float_to_bf16, threads);
    } else {
      tools::fill_normal(host.get(), count, seed, float(stddev), float_to_half, threads);
    }
    check(cudaMemcpy(memory_.get(), host.get(), bytes_, cudaMemcpyHostToDevice), "cudaMemcpy");
  }

 private:
  DType dtype_;
  std::vector<int64_t> shape_;
  size_t bytes_ = 0;
  cuda::DeviceMemory memory_;
};

class Stream {
 public:
  Stream() {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event() { check(cudaEventCreate(&event_), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// One call captured into a CUDA graph on `stream` and instantiated. An eager call comes first,
// so that what a first call does once (selection, kernel attributes, workspace pools) stays out
// of the capture.
class CapturedCall {
 public:
  template <typename Call>
  CapturedCall(cudaStream_t stream, Call&& call) {
    call();
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
    try {
      call();
    } catch (...) {
      cudaGraph_t partial = nullptr;
      cudaStreamEndCapture(stream, &partial);
      if (partial) cudaGraphDestroy(partial);
      cudaGetLastError();
      throw;
    }
    check(cudaStreamEndCapture(stream, &graph_),
          "cudaStreamEndCapture (--graph: the call could not be captured)");
    const cudaError_t instantiated = cudaGraphInstantiate(&exec_, graph_, 0);
    if (instantiated != cudaSuccess) {
      cudaGraphDestroy(graph_);
      check(instantiated, "cudaGraphInstantiate");
    }
  }
  ~CapturedCall() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }
  CapturedCall(const CapturedCall&) = delete;
  CapturedCall& operator=(const CapturedCall&) = delete;
  void replay(cudaStream_t stream) const {
    check(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
  }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// o.warmup untimed calls, then o.iters timed ones (CUDA events around each on `stream`): the
// median and the fastest into r. With --graph each call is a replay of one captured call.
template <typename Call>
void time_calls(const BenchOptions& o, cudaStream_t stream, Call&& call, BenchResult& r) {
  std::optional<CapturedCall> captured;
  if (o.graph) captured.emplace(stream, call);
  auto run = [&] {
    if (captured) {
      captured->replay(stream);
    } else {
      call();
    }
  };
  for (int i = 0; i < o.warmup; ++i) run();
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  Event start, stop;
  std::vector<double> times;
  for (int i = 0; i < o.iters; ++i) {
    check(cudaEventRecord(start.get(), stream), "cudaEventRecord");
    run();
    check(cudaEventRecord(stop.get(), stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  check(cudaGetLastError(), "a kernel launch");
  std::sort(times.begin(), times.end());
  r.median_ms = times[times.size() / 2];
  r.min_ms = times.front();
}

BenchResult run_one(const BenchOptions& o, const BenchShape& s, uint64_t seed) {
  BenchResult r;
  r.shape = s;
  const int64_t b = s.batch, sq = s.seqlen_q, skv = s.seqlen_kv;
  // bshd [b, rows, heads, dim], or thd [b * rows, heads, dim] with --varlen.
  auto rows_of = [&](int64_t rows, int64_t heads, int64_t dim) {
    return o.varlen ? std::vector<int64_t>{b * rows, heads, dim}
                    : std::vector<int64_t>{b, rows, heads, dim};
  };
  BenchTensor q(o.dtype, rows_of(sq, s.heads_q, s.head_dim_qk));
  BenchTensor k(o.dtype, rows_of(skv, s.heads_kv, s.head_dim_qk));
  BenchTensor v(o.dtype, rows_of(skv, s.heads_kv, s.head_dim_v));
  BenchTensor out(o.dtype, rows_of(sq, s.heads_q, s.head_dim_v));
  BenchTensor lse(DType::kFloat32, o.varlen ? std::vector<int64_t>{s.heads_q, b * sq}
                                            : std::vector<int64_t>{b, s.heads_q, sq});
  q.fill_random(seed * 16 + 1, 1.0);
  k.fill_random(seed * 16 + 2, 1.0);
  v.fill_random(seed * 16 + 3, 1.0);
  std::optional<BenchTensor> offsets;
  if (o.config.softmax_type == SoftmaxType::kLearnable) {
    offsets.emplace(DType::kFloat32, std::vector<int64_t>{s.heads_q});
    offsets->fill_random(seed * 16 + 4, 2.0);
  }

  Stream stream;
  DotProductAttention attention(o.config);
  ForwardArgs fwd;
  fwd.in.q = q.view();
  fwd.in.k = k.view();
  fwd.in.v = v.view();
  if (offsets) fwd.in.softmax_offset = offsets->view();
  std::optional<BenchTensor> cu_seqlens_q, cu_seqlens_kv;
  if (o.varlen) {
    auto boundaries = [&](int64_t length) {
      std::vector<int32_t> cu(size_t(b) + 1);
      for (int64_t i = 0; i <= b; ++i) cu[size_t(i)] = int32_t(i * length);
      BenchTensor t(DType::kInt32, {b + 1});
      check(
          cudaMemcpy(t.view().data, cu.data(), cu.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
          "cudaMemcpy");
      return t;
    };
    cu_seqlens_q.emplace(boundaries(sq));
    cu_seqlens_kv.emplace(boundaries(skv));
    fwd.in.cu_seqlens_q = cu_seqlens_q->view();
    fwd.in.cu_seqlens_kv = cu_seqlens_kv->view();
  }
  fwd.o = out.view();
  fwd.lse = lse.view();
  fwd.stream = stream.get();

  const bool needs_backward = o.pass != BenchPass::kForward;
  std::optional<BenchTensor> d_o, dq, dk, dv, d_offsets;
  BackwardArgs bwd;
  if (needs_backward) {
    d_o.emplace(o.dtype, rows_of(sq, s.heads_q, s.head_dim_v));
    d_o->fill_random(seed * 16 + 5, 1.0);
    dq.emplace(o.dtype, rows_of(sq, s.heads_q, s.head_dim_qk));
    dk.emplace(o.dtype, rows_of(skv, s.heads_kv, s.head_dim_qk));
    dv.emplace(o.dtype, rows_of(skv, s.heads_kv, s.head_dim_v));
    // The RNG state comes from each timed forward (below).
    bwd = backward_args_for(fwd, ForwardResult{}, d_o->view(), dq->view(), dk->view(), dv->view());
    if (offsets) {
      d_offsets.emplace(DType::kFloat32, std::vector<int64_t>{s.heads_q});
      bwd.dsoftmax_offset = d_offsets->view();
    }
  }

  BackendKind forward_backend = BackendKind::kAuto, backward_backend = BackendKind::kAuto;
  auto call = [&] {
    if (o.pass != BenchPass::kBackward) {
      ForwardResult result = attention.forward(fwd);
      forward_backend = result.backend;
      bwd.rng = result.rng;
    }
    if (needs_backward) backward_backend = attention.backward(bwd);
  };
  if (o.pass == BenchPass::kBackward) {
    // The backward reads the forward's o and LSE: one forward first, untimed.
    ForwardResult result = attention.forward(fwd);
    forward_backend = result.backend;
    bwd.rng = result.rng;
  }
  time_calls(o, stream.get(), call, r);

  switch (o.pass) {
    case BenchPass::kForward:
      r.backend = std::string(to_string(forward_backend));
      break;
    case BenchPass::kBackward:
      r.backend = std::string(to_string(backward_backend));
      break;
    case BenchPass::kForwardBackward:
      r.backend = std::string(to_string(forward_backend));
      if (backward_backend != forward_backend)
        r.backend += "+" + std::string(to_string(backward_backend));
      break;
  }
  r.flops = forward_flops(s, o.config);
  r.tflops = r.flops.forward * pass_factor(o.pass) / (r.median_ms * 1e-3) / 1e12;
  if (sq <= 16 && o.pass == BenchPass::kForward) {
    const double bytes = double(q.bytes() + k.bytes() + v.bytes() + out.bytes());
    r.gbps = bytes / (r.median_ms * 1e-3) / 1e9;
  }
  return r;
}

// The cache positions the queries of one sequence can see: the union of their visible ranges
// (bottom-right diagonal), which is what the call must read.
int64_t decode_read_keys(const BenchShape& s, const AttentionConfig& c) {
  const int64_t right = mask_is_causal(c.mask_type) ? 0 : c.window_right;
  const int64_t diagonal = s.seqlen_kv - s.seqlen_q;
  const KeyRange first = visible_keys(0, s.seqlen_q, s.seqlen_kv, diagonal, c.window_left, right);
  const KeyRange last =
      visible_keys(s.seqlen_q - 1, s.seqlen_q, s.seqlen_kv, diagonal, c.window_left, right);
  return std::max<int64_t>(0, last.end - first.begin);
}

// KvCacheAttention: sq queries per sequence over skv cached keys; with --append the call first
// writes the last sq of them (k_new, v_new: each timed call writes the same slots).
BenchResult run_decode_one(const BenchOptions& o, const BenchShape& s, uint64_t seed) {
  BenchResult r;
  r.shape = s;
  const int64_t b = s.batch, sq = s.seqlen_q, skv = s.seqlen_kv, G = s.heads_kv;
  const int64_t pages = o.page_size > 0 ? (skv + o.page_size - 1) / o.page_size : 0;
  const std::vector<int64_t> cache_shape =
      o.page_size > 0 ? std::vector<int64_t>{b * pages, o.page_size, G, s.head_dim_qk}
                      : std::vector<int64_t>{b, skv, G, s.head_dim_qk};
  std::vector<int64_t> v_shape = cache_shape;
  v_shape.back() = s.head_dim_v;
  BenchTensor q(o.dtype, {b, sq, s.heads_q, s.head_dim_qk});
  BenchTensor k_cache(o.dtype, cache_shape), v_cache(o.dtype, v_shape);
  BenchTensor out(o.dtype, {b, sq, s.heads_q, s.head_dim_v});
  BenchTensor lse(DType::kFloat32, {b, s.heads_q, sq});
  BenchTensor seqlens(DType::kInt32, {b});
  q.fill_random(seed * 16 + 1, 1.0);
  k_cache.fill_random(seed * 16 + 2, 1.0);
  v_cache.fill_random(seed * 16 + 3, 1.0);
  const int64_t cached = o.append ? skv - sq : skv;  // the cache's tokens before the call
  const std::vector<int32_t> lengths(static_cast<size_t>(b), static_cast<int32_t>(cached));
  check(cudaMemcpy(seqlens.view().data, lengths.data(), lengths.size() * sizeof(int32_t),
                   cudaMemcpyHostToDevice),
        "cudaMemcpy");
  std::optional<BenchTensor> table, offsets;
  if (o.page_size > 0) {
    // The pages in a shuffled order, as a serving engine's pool hands them out.
    std::vector<int32_t> order(size_t(b * pages));
    for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = order.size(); i > 1; --i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      std::swap(order[i - 1], order[size_t(state % i)]);
    }
    table.emplace(DType::kInt32, std::vector<int64_t>{b, pages});
    check(cudaMemcpy(table->view().data, order.data(), order.size() * sizeof(int32_t),
                     cudaMemcpyHostToDevice),
          "cudaMemcpy");
  }
  if (o.config.softmax_type == SoftmaxType::kLearnable) {
    offsets.emplace(DType::kFloat32, std::vector<int64_t>{s.heads_q});
    offsets->fill_random(seed * 16 + 4, 2.0);
  }

  KvCacheConfig config;
  config.causal = mask_is_causal(o.config.mask_type);
  config.window_left = o.config.window_left;
  config.window_right = o.config.window_right;
  config.softcap = o.config.softcap;
  config.softmax_type = o.config.softmax_type;
  config.backend = o.config.backend;
  Stream stream;
  KvCacheAttention attention(config);
  KvCacheArgs args;
  args.q = q.view();
  args.k_cache = k_cache.view();
  args.v_cache = v_cache.view();
  if (table) args.block_table = table->view();
  args.cache_seqlens = seqlens.view();
  if (offsets) args.softmax_offset = offsets->view();
  std::optional<BenchTensor> k_new, v_new;
  if (o.append) {
    k_new.emplace(o.dtype, std::vector<int64_t>{b, sq, G, s.head_dim_qk});
    v_new.emplace(o.dtype, std::vector<int64_t>{b, sq, G, s.head_dim_v});
    k_new->fill_random(seed * 16 + 5, 1.0);
    v_new->fill_random(seed * 16 + 6, 1.0);
    args.k_new = k_new->view();
    args.v_new = v_new->view();
  }
  args.o = out.view();
  args.lse = lse.view();
  args.stream = stream.get();

  BackendKind backend = BackendKind::kAuto;
  time_calls(
      o, stream.get(), [&] { backend = attention.forward(args); }, r);
  r.backend = std::string(to_string(backend));
  const int64_t right = config.causal ? 0 : config.window_right;
  const double pairs = double(visible_pairs(sq, skv, skv - sq, config.window_left, right));
  r.flops = {2.0 * double(b * s.heads_q) * pairs * double(s.head_dim_qk + s.head_dim_v),
             "visible pairs on the bottom-right diagonal: 2*b*H*pairs*(dqk+dv)"};
  r.tflops = r.flops.forward / (r.median_ms * 1e-3) / 1e12;
  const double element = double(dtype_size(o.dtype));
  const double read = double(decode_read_keys(s, o.config));
  // The appended rows are read from k_new / v_new and written into the cache: twice their bytes.
  const double appended = k_new ? 2.0 * double(k_new->bytes() + v_new->bytes()) : 0.0;
  const double bytes =
      double(b) * read * double(G) * double(s.head_dim_qk + s.head_dim_v) * element +
      double(q.bytes() + out.bytes()) + appended;
  r.gbps = bytes / (r.median_ms * 1e-3) / 1e9;
  return r;
}

int run_bench(const BenchOptions& o) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    throw Error(ErrorCode::kNotSupported, "", "dpa bench needs a CUDA device; none is present");
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const std::string device = prop.name;

  // Held for the whole run, allocated before the inputs and the library's first workspace.
  const cuda::DeviceMemory pad(size_t(o.pad_mib) << 20, 0);

  std::vector<std::string> json;
  bool failed = false;
  const std::string held =
      o.pad_mib > 0 ? ", " + std::to_string(o.pad_mib) + " MiB held first" : "";
  std::printf("# %s, %s, median of %d runs after %d warm-up%s\n", device.c_str(),
              describe_config(o).c_str(), o.iters, o.warmup, held.c_str());
  for (size_t n = 0; n < o.shapes.size(); ++n) {
    const BenchShape& shape = o.shapes[n];
    BenchResult r;
    try {
      r = o.decode ? run_decode_one(o, shape, o.seed + n) : run_one(o, shape, o.seed + n);
    } catch (const std::exception& e) {
      r.shape = shape;
      r.error = e.what();
      failed = true;
    }
    std::string line =
        (o.label.empty() ? "" : o.label + "  ") + shape.text() + "  " + describe_config(o);
    if (!r.error.empty()) {
      std::printf("%s  error: %s\n", line.c_str(), r.error.c_str());
    } else {
      // Four places: a decode call of 9 us printed as 0.009 ms hid a 10% change (session 51).
      std::printf("%s  %s  %.4f ms  %.1f TFLOP/s", line.c_str(), r.backend.c_str(), r.median_ms,
                  r.tflops);
      if (r.gbps) std::printf("  %.0f GB/s", *r.gbps);
      std::printf("\n");
    }
    std::fflush(stdout);
    json.push_back(to_json(o, r, device));
  }
  if (o.json_path) {
    std::ofstream file(*o.json_path);
    if (!file) throw Error(ErrorCode::kIo, "", "cannot write " + *o.json_path);
    file << "[\n";
    for (size_t n = 0; n < json.size(); ++n)
      file << "  " << json[n] << (n + 1 < json.size() ? ",\n" : "\n");
    file << "]\n";
    if (!file) throw Error(ErrorCode::kIo, "", "cannot write " + *o.json_path);
  }
  return failed ? kExitFailure : kExitOk;
}

#endif  // DPA_WITH_CUDA

}  // namespace

int bench_command(const std::vector<std::string>& words) {
  return run_guarded(
      "bench", [](std::string_view) { return std::string(); },
      [&]() -> int {
        const std::vector<FlagSpec> specs = bench_flag_specs();
        ParsedArgs args = parse_args(specs, words);
        if (args.help_requested()) {
          std::cout << bench_usage();
          return kExitOk;
        }
        const BenchOptions options = parse_bench_options(args);
#if defined(DPA_WITH_CUDA)
        return run_bench(options);
#else
        (void)options;
        std::cerr << "dpa bench: error: this build of dpa has no CUDA support\n";
        return kExitUsage;
#endif
      });
}

}  // namespace dpa::cli
