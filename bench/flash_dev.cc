// Dev bench for the flash forward kernels (llm.c's dev/cuda style): one small correctness
// check against cpu_exact per feature set, then timings of the shapes with CUDA
// events. Calls the backends directly (no selector) so it builds before every backend exists.
// --backward times the backward on its kernel families (mma_sync, one_kernel, or
// those --families lists) and prints how far apart their gradients are (the GPU suite checks
// each against cpu_exact).
//
//   flash_dev [--check-only] [--time-only] [--variants [--variant-head-dim D] [--variant N]...]
//             [--backward [--families a,b,...]]
// --variant-head-dim keeps the variants of one head dim (all of them take minutes); --variant
// (repeated) keeps the variants it names.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench/flash_variants.h"
#include "core/attention_math.h"
#include "core/element_access.h"
#include "core/environment.h"
#include "core/problem_builder.h"
#include "cpu/cpu_backends.h"
#include "cuda/cuda_backends.h"
#include "cuda/cuda_check.h"
#include "cuda/runtime.h"

namespace {

using namespace dpa;

struct Shape {
  int b, H, G, sq, skv, d, dv;
};

struct Features {
  std::string name;
  double softcap = 0;
  SoftmaxType softmax = SoftmaxType::kVanilla;
  MaskType mask = MaskType::kNoMask;
  int window_left = -1, window_right = -1;
  double dropout = 0;
  bool alibi = false;
};

struct DeviceTensor {
  size_t bytes = 0;
  cuda::DeviceMemory memory;
  TensorView view;
  DeviceTensor(DType dtype, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    bytes = size_t(n) * dtype_size(dtype);
    memory = cuda::DeviceMemory(std::max<size_t>(bytes, 16), 0);
    view =
        TensorView::contiguous(memory.get(), dtype, shape.data(), int(shape.size()), Device::kCUDA);
  }
  void upload(const std::vector<unsigned char>& host) {
    DPA_CUDA_CHECK(cudaMemcpy(memory.get(), host.data(), bytes, cudaMemcpyHostToDevice));
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> host(bytes);
    DPA_CUDA_CHECK(cudaMemcpy(host.data(), memory.get(), bytes, cudaMemcpyDeviceToHost));
    return host;
  }
};

std::vector<unsigned char> random_bf16(int64_t n, std::mt19937_64& rng, double stddev) {
  std::vector<unsigned char> bytes(size_t(n) * 2);
  std::normal_distribution<double> normal(0, stddev);
  for (int64_t i = 0; i < n; ++i) store_element(bytes.data(), DType::kBFloat16, i, normal(rng));
  return bytes;
}

AttentionConfig make_config(const Features& f) {
  AttentionConfig c;
  c.softcap = f.softcap;
  c.softmax_type = f.softmax;
  c.mask_type = f.mask;
  c.window_left = f.window_left;
  c.window_right = f.window_right;
  c.dropout = f.dropout;
  // The backends are called directly here, so this is the edge that reads the environment
  // (DPA_FLASH_FORWARD_KERNEL, DPA_FLASH_BACKWARD_KERNEL), as the API's constructors do.
  return config_with_environment(c, process_environment());
}

// Median of `runs` timings of launch() with CUDA events, after `warmups` untimed calls.
template <typename Launch>
double median_event_ms(Launch&& launch, int warmups, int runs) {
  for (int i = 0; i < warmups; ++i) launch();
  DPA_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  DPA_CUDA_CHECK(cudaEventCreate(&start));
  DPA_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < runs; ++i) {
    DPA_CUDA_CHECK(cudaEventRecord(start));
    launch();
    DPA_CUDA_CHECK(cudaEventRecord(stop));
    DPA_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    DPA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Run {
  std::vector<unsigned char> q, k, v, o;
  std::vector<float> lse, sink, slopes;
};

// Runs the flash backend on device tensors (and fills host copies for the reference).
double run_flash(const Shape& s, const Features& f, Run& run, int timing_iters, int variant = -1) {
  std::mt19937_64 rng(1234);
  const int64_t nq = int64_t(s.b) * s.sq * s.H * s.d, nk = int64_t(s.b) * s.skv * s.G * s.d;
  const int64_t nv = int64_t(s.b) * s.skv * s.G * s.dv;
  run.q = random_bf16(nq, rng, 1.5);
  run.k = random_bf16(nk, rng, 1.5);
  run.v = random_bf16(nv, rng, 1.0);
  run.sink.resize(size_t(s.H));
  for (auto& x : run.sink) x = float(std::normal_distribution<double>(0, 5)(rng));
  run.slopes.resize(size_t(s.H));
  for (int h = 0; h < s.H; ++h) run.slopes[size_t(h)] = 0.05f * float(h + 1);
  DeviceTensor q(DType::kBFloat16, {s.b, s.sq, s.H, s.d}),
      k(DType::kBFloat16, {s.b, s.skv, s.G, s.d});
  DeviceTensor v(DType::kBFloat16, {s.b, s.skv, s.G, s.dv}),
      o(DType::kBFloat16, {s.b, s.sq, s.H, s.dv});
  DeviceTensor lse(DType::kFloat32, {s.b, s.H, s.sq}), sink(DType::kFloat32, {s.H});
  DeviceTensor slopes(DType::kFloat32, {s.H});
  q.upload(run.q);
  k.upload(run.k);
  v.upload(run.v);
  DPA_CUDA_CHECK(
      cudaMemcpy(sink.memory.get(), run.sink.data(), sink.bytes, cudaMemcpyHostToDevice));
  DPA_CUDA_CHECK(
      cudaMemcpy(slopes.memory.get(), run.slopes.data(), slopes.bytes, cudaMemcpyHostToDevice));
  DPA_CUDA_CHECK(cudaMemset(o.memory.get(), 0xff, o.bytes));  // poison: NaN bf16

  ForwardArgs args;
  args.in.q = q.view;
  args.in.k = k.view;
  args.in.v = v.view;
  if (f.softmax == SoftmaxType::kLearnable) args.in.softmax_offset = sink.view;
  if (f.alibi) args.in.alibi_slopes = slopes.view;
  args.o = o.view;
  args.lse = lse.view;
  AttentionConfig config = make_config(f);
  AttentionProblem problem = build_forward_problem(config, args, config.dropout, RngState{7, 3});
  auto launch = [&] {
    if (variant < 0)
      cuda_flash_backend().forward(problem);
    else
      cuda::run_flash_variant(variant, problem);
  };
  launch();
  DPA_CUDA_CHECK(cudaDeviceSynchronize());
  double median_ms = 0;
  if (timing_iters > 0) {
    median_ms = median_event_ms(launch, 3, timing_iters);
  }
  run.o = o.download();
  std::vector<unsigned char> lse_bytes = lse.download();
  run.lse.resize(lse_bytes.size() / 4);
  std::memcpy(run.lse.data(), lse_bytes.data(), lse_bytes.size());
  return median_ms;
}

bool check(const Shape& s, const Features& f, int variant = -1) {
  Run run;
  run_flash(s, f, run, 0, variant);
  // Reference: cpu_exact on the same bf16 inputs.
  std::vector<double> o_ref(size_t(s.b) * s.sq * s.H * s.dv);
  std::vector<float> lse_ref(size_t(s.b) * s.H * s.sq);
  auto widen = [](const std::vector<unsigned char>& bf16) {
    std::vector<double> wide(bf16.size() / 2);
    for (size_t i = 0; i < wide.size(); ++i)
      wide[i] = load_element(bf16.data(), DType::kBFloat16, int64_t(i));
    return wide;
  };
  std::vector<double> q64 = widen(run.q), k64 = widen(run.k), v64 = widen(run.v);
  TensorView q = TensorView::contiguous(q64.data(), DType::kFloat64, {s.b, s.sq, s.H, s.d});
  TensorView k = TensorView::contiguous(k64.data(), DType::kFloat64, {s.b, s.skv, s.G, s.d});
  TensorView v = TensorView::contiguous(v64.data(), DType::kFloat64, {s.b, s.skv, s.G, s.dv});
  ForwardArgs args;
  args.in.q = q;
  args.in.k = k;
  args.in.v = v;
  if (f.softmax == SoftmaxType::kLearnable)
    args.in.softmax_offset = TensorView::contiguous(run.sink.data(), DType::kFloat32, {s.H});
  if (f.alibi)
    args.in.alibi_slopes = TensorView::contiguous(run.slopes.data(), DType::kFloat32, {s.H});
  args.o = TensorView::contiguous(o_ref.data(), DType::kFloat64, {s.b, s.sq, s.H, s.dv});
  args.lse = TensorView::contiguous(lse_ref.data(), DType::kFloat32, {s.b, s.H, s.sq});
  AttentionConfig config = make_config(f);
  AttentionProblem problem = build_forward_problem(config, args, config.dropout, RngState{7, 3});
  cpu_exact_backend().forward(problem);
  double diff = 0, ref = 0, lse_err = 0;
  bool nan = false;
  for (size_t i = 0; i < o_ref.size(); ++i) {
    double got = load_element(run.o.data(), DType::kBFloat16, int64_t(i));
    nan |= std::isnan(got);
    diff += (got - o_ref[i]) * (got - o_ref[i]);
    ref += o_ref[i] * o_ref[i];
  }
  for (size_t i = 0; i < lse_ref.size(); ++i) {
    if (lse_ref[i] == run.lse[i]) continue;
    lse_err = std::max(lse_err, double(std::fabs(lse_ref[i] - run.lse[i])));
    nan |= std::isnan(run.lse[i]);
  }
  const double rel = std::sqrt(diff / std::max(ref, 1e-30));
  const bool ok = !nan && rel < 2e-2 && lse_err < 2e-2;
  if (variant >= 0) std::printf("[%s] ", cuda::flash_variant_name(variant));
  std::printf("check %-28s b%d H%d G%d sq%d skv%d d%d/%d: o rel %.2e, lse max abs %.2e %s\n",
              f.name.c_str(), s.b, s.H, s.G, s.sq, s.skv, s.d, s.dv, rel, lse_err,
              ok ? "ok" : "FAIL");
  return ok;
}

double visible_pairs(const Shape& s, const Features& f);

// The one-kernel backward after one forward (for o and LSE): median ms of 20 runs per kernel family
// (config.flash_backward_kernel names: mma_sync, one_kernel), TFLOP/s at 2.5x the
// forward's FLOPs, and each family's relative difference from the first one's gradients.
void time_backward(const Shape& s, const Features& f, const std::vector<std::string>& families) {
  std::mt19937_64 rng(99);
  const int64_t nq = int64_t(s.b) * s.sq * s.H * s.d, nk = int64_t(s.b) * s.skv * s.G * s.d;
  const int64_t nv = int64_t(s.b) * s.skv * s.G * s.dv, no = int64_t(s.b) * s.sq * s.H * s.dv;
  DeviceTensor q(DType::kBFloat16, {s.b, s.sq, s.H, s.d}),
      k(DType::kBFloat16, {s.b, s.skv, s.G, s.d}), v(DType::kBFloat16, {s.b, s.skv, s.G, s.dv});
  DeviceTensor o(DType::kBFloat16, {s.b, s.sq, s.H, s.dv}),
      d_o(DType::kBFloat16, {s.b, s.sq, s.H, s.dv});
  DeviceTensor lse(DType::kFloat32, {s.b, s.H, s.sq}), sink(DType::kFloat32, {s.H}),
      dsink(DType::kFloat32, {s.H});
  DeviceTensor dq(DType::kBFloat16, {s.b, s.sq, s.H, s.d}),
      dk(DType::kBFloat16, {s.b, s.skv, s.G, s.d}), dv(DType::kBFloat16, {s.b, s.skv, s.G, s.dv});
  q.upload(random_bf16(nq, rng, 1.5));
  k.upload(random_bf16(nk, rng, 1.5));
  v.upload(random_bf16(nv, rng, 1.0));
  d_o.upload(random_bf16(no, rng, 1.0));
  std::vector<float> offsets(size_t(s.H));
  for (auto& x : offsets) x = float(std::normal_distribution<double>(0, 5)(rng));
  DPA_CUDA_CHECK(cudaMemcpy(sink.memory.get(), offsets.data(), sink.bytes, cudaMemcpyHostToDevice));

  ForwardArgs fwd;
  fwd.in.q = q.view;
  fwd.in.k = k.view;
  fwd.in.v = v.view;
  if (f.softmax == SoftmaxType::kLearnable) fwd.in.softmax_offset = sink.view;
  fwd.o = o.view;
  fwd.lse = lse.view;
  const AttentionConfig config = make_config(f);
  const RngState state{7, 3};
  cuda_flash_backend().forward(build_forward_problem(config, fwd, config.dropout, state));
  BackwardArgs bwd;
  bwd.in = fwd.in;
  bwd.o = o.view;
  bwd.lse = lse.view;
  bwd.d_o = d_o.view;
  bwd.dq = dq.view;
  bwd.dk = dk.view;
  bwd.dv = dv.view;
  bwd.rng = state;
  if (f.softmax == SoftmaxType::kLearnable) bwd.dsoftmax_offset = dsink.view;
  AttentionProblem problem = build_backward_problem(config, bwd, config.dropout);

  const double flops = 2.5 * 2.0 * s.b * s.H * visible_pairs(s, f) * (s.d + s.dv);
  const size_t kFamilies = families.size();
  std::vector<std::vector<std::vector<unsigned char>>> gradients(kFamilies);
  for (size_t family = 0; family < kFamilies; ++family) {
    const std::optional<FlashBackwardKernel> kernel = parse_flash_backward_kernel(families[family]);
    if (!kernel) {
      std::fprintf(stderr, "flash_dev: unknown backward family '%s'\n", families[family].c_str());
      std::exit(2);
    }
    problem.flash_backward_kernel = *kernel;
    auto launch = [&] { cuda_flash_backend().backward(problem); };
    const double ms = median_event_ms(launch, 2, 20);
    gradients[family] = {dq.download(), dk.download(), dv.download()};
    std::printf("bwd   %-28s b%d H%d G%d sq%d skv%d d%d/%d [%s]: %.3f ms  %.1f TFLOP/s\n",
                f.name.c_str(), s.b, s.H, s.G, s.sq, s.skv, s.d, s.dv, families[family].c_str(), ms,
                flops / ms * 1e-9);
  }
  const char* names[] = {"dq", "dk", "dv"};
  for (size_t family = 1; family < kFamilies; ++family)
    for (int g = 0; g < 3; ++g) {
      double diff = 0, norm = 0;
      const int64_t n = int64_t(gradients[0][size_t(g)].size() / 2);
      for (int64_t i = 0; i < n; ++i) {
        const double a = load_element(gradients[0][size_t(g)].data(), DType::kBFloat16, i);
        const double b = load_element(gradients[family][size_t(g)].data(), DType::kBFloat16, i);
        diff += (a - b) * (a - b);
        norm += a * a;
      }
      std::printf("      %s: %s vs %s relative difference %.2e\n", names[g], families[0].c_str(),
                  families[family].c_str(), std::sqrt(diff / std::max(norm, 1e-30)));
    }
}

// Exact count of (query, key) pairs the mask leaves visible, per (b, h).
double visible_pairs(const Shape& s, const Features& f) {
  const int diagonal = f.mask == MaskType::kCausal ? 0 : s.skv - s.sq;
  const int right = mask_is_causal(f.mask) ? 0 : f.window_right;
  return double(dpa::visible_pairs(s.sq, s.skv, diagonal, f.window_left, right));
}

void time_config(const Shape& s, const Features& f, int variant = -1) {
  Run run;
  const double ms = run_flash(s, f, run, 20, variant);
  const double flops = 2.0 * s.b * s.H * visible_pairs(s, f) * (s.d + s.dv);
  const double bytes =
      2.0 * (double(s.b) * s.sq * s.H * (s.d + s.dv) + double(s.b) * s.skv * s.G * (s.d + s.dv));
  if (variant >= 0) std::printf("[%s] ", cuda::flash_variant_name(variant));
  std::printf("time  %-28s b%d H%d G%d sq%d skv%d d%d/%d: %.3f ms  %.1f TFLOP/s  %.0f GB/s\n",
              f.name.c_str(), s.b, s.H, s.G, s.sq, s.skv, s.d, s.dv, ms, flops / ms * 1e-9,
              bytes / ms * 1e-6);
}

}  // namespace

int main(int argc, char** argv) {
  bool do_check = true, do_time = true, do_variants = false, do_backward = false;
  int variant_head_dim = 0;         // 0: every variant
  std::vector<int> named_variants;  // empty: every variant
  std::vector<std::string> families = {"mma_sync", "one_kernel"};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--families") == 0 && i + 1 < argc) {
      families.clear();
      std::string list = argv[++i];
      for (size_t start = 0; start <= list.size();) {
        const size_t comma = std::min(list.find(',', start), list.size());
        families.push_back(list.substr(start, comma - start));
        start = comma + 1;
      }
    }
    if (std::strcmp(argv[i], "--variants") == 0) do_variants = true;
    if (std::strcmp(argv[i], "--variant-head-dim") == 0 && i + 1 < argc)
      variant_head_dim = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--variant") == 0 && i + 1 < argc)
      named_variants.push_back(std::atoi(argv[++i]));
    if (std::strcmp(argv[i], "--backward") == 0) do_backward = true;
    if (std::strcmp(argv[i], "--check-only") == 0) do_time = false;
    if (std::strcmp(argv[i], "--time-only") == 0) do_check = false;
  }
  try {
    Features plain{"plain"}, cap{"softcap50"}, cap1{"softcap1"}, sink{"learnable_sink"};
    cap.softcap = 50;
    cap1.softcap = 1;
    sink.softmax = SoftmaxType::kLearnable;
    Features causal_cap = cap, causal_sink = sink, gptoss{"gpt-oss window128 sink"};
    causal_cap.name = "causal softcap50";
    causal_cap.mask = MaskType::kCausal;
    causal_sink.name = "causal learnable_sink";
    causal_sink.mask = MaskType::kCausal;
    gptoss.mask = MaskType::kCausal;
    gptoss.window_left = 128;
    gptoss.softmax = SoftmaxType::kLearnable;
    // Gemma 2's local layers: a 4096-token window with softcap 50 (d = 256 at 9B and 27B).
    Features gemma_local{"gemma2 window4096 softcap50"};
    gemma_local.mask = MaskType::kCausal;
    gemma_local.window_left = 4095;
    gemma_local.window_right = 0;
    gemma_local.softcap = 50;
    Features drop{"dropout0.3 softcap1"};
    drop.dropout = 0.3;
    drop.softcap = 1;
    Features alibi{"alibi off-by-one window"};
    alibi.alibi = true;
    alibi.softmax = SoftmaxType::kOffByOne;
    alibi.window_left = 40;
    alibi.window_right = 7;
    int failures = 0;
    if (do_check) {
      const Shape small{2, 4, 2, 97, 203, 128, 128};
      for (const Features& f : {plain, cap1, sink, causal_cap, causal_sink, gptoss, drop, alibi})
        failures += !check(small, f);
      for (int d : {64, 96, 192, 256}) failures += !check({1, 4, 1, 130, 70, d, d}, cap1);
      failures += !check({1, 4, 4, 77, 150, 192, 128}, causal_sink);
      failures += !check({1, 64, 8, 1, 4099, 64, 64}, sink);         // decode: split-KV
      failures += !check({1, 8, 8, 3, 2500, 128, 128}, causal_cap);  // bottom-right? top-left
    }
    if (do_time) {
      const Shape big{2, 16, 16, 8192, 8192, 128, 128};
      for (const Features& f : {plain, cap, sink, causal_cap, causal_sink}) time_config(big, f);
      time_config({2, 16, 16, 8192, 8192, 64, 64}, cap);
      time_config({2, 16, 16, 8192, 8192, 256, 256}, cap);
      time_config({2, 64, 8, 8192, 8192, 64, 64}, gptoss);
      time_config({1, 64, 8, 1, 32768, 64, 64}, sink);
      time_config({1, 64, 8, 1, 32768, 128, 128}, sink);
    }
    if (do_variants) {
      // Every variant is checked against cpu_exact before it is timed.
      auto skipped = [&](int v) {
        if (!named_variants.empty() &&
            std::find(named_variants.begin(), named_variants.end(), v) == named_variants.end())
          return true;
        return variant_head_dim != 0 && cuda::flash_variant_head_dim(v) != variant_head_dim;
      };
      for (int v = 0; cuda::flash_variant_name(v); ++v) {
        if (skipped(v)) continue;
        const int d = cuda::flash_variant_head_dim(v);
        for (const Features& f : {plain, cap1, causal_cap, causal_sink, gptoss})
          failures += !check({2, 4, 2, 97, 203, d, d}, f, v);
        failures += !check({1, 8, 2, 300, 300, d, d}, causal_sink, v);  // 3 blocks of work
      }
      for (int v = 0; cuda::flash_variant_name(v); ++v) {
        if (skipped(v)) continue;
        if (cuda::flash_variant_head_dim(v) == 64) {  // gpt-oss: GQA 64/8, window 128, sink
          for (const Features& f : {gptoss, plain})
            time_config({2, 64, 8, 8192, 8192, 64, 64}, f, v);
          for (const Features& f : {plain, cap, causal_sink})
            time_config({2, 32, 32, 8192, 8192, 64, 64}, f, v);
          continue;
        }
        if (cuda::flash_variant_head_dim(v) == 256) {
          for (const Features& f : {plain, cap, causal_sink})
            time_config({2, 8, 8, 8192, 8192, 256, 256}, f, v);
          // The library keeps 64-key tiles under a window (flash_forward_wgmma_ws_block_n).
          time_config({1, 16, 8, 16384, 16384, 256, 256}, gemma_local, v);
          continue;
        }
        const Shape big{2, 16, 16, 8192, 8192, 128, 128};
        for (const Features& f : {plain, cap, sink, causal_cap, causal_sink})
          time_config(big, f, v);
      }
    }
    if (do_backward) {
      const Shape big{2, 16, 16, 8192, 8192, 128, 128};
      for (const Features& f : {plain, cap, sink, causal_cap, causal_sink})
        time_backward(big, f, families);
    }
    std::printf("flash_dev: %d check failures\n", failures);
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flash_dev: %s\n", e.what());
    return 2;
  }
}
