// The host cost of one DotProductAttention::forward call at a decode shape (b=1, sq=1,
// skv=1024, H=8, G=8, d=128): the C++ baseline that python/bench/overhead.py compares the
// Python paths with (docs/perf.md). Device tensors: bf16 on the current stream, timed as wall
// time over many back-to-back calls, which is the host's enqueue cost when it exceeds the
// kernel's time (the bench also reports the kernel's CUDA-event time to show which dominates).
// Host tensors: fp32 on the cpu backend.
//
//   call_overhead [--device cpu|cuda] [--iters N] [--keys N] [--workspace]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dpa/attention.h"

#if defined(DPA_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "cuda/runtime.h"
#endif

namespace {

constexpr int64_t kBatch = 1, kQueries = 1, kHeads = 8, kDim = 128;

struct Buffers {
  explicit Buffers(dpa::Device on) : device(on) {}
  dpa::Device device;
  std::vector<std::vector<char>> host;
#if defined(DPA_WITH_CUDA)
  std::vector<dpa::cuda::DeviceMemory> on_device;
#endif
  void* make(size_t bytes) {
#if defined(DPA_WITH_CUDA)
    if (device == dpa::Device::kCUDA) {
      on_device.emplace_back(bytes, 0);
      cudaMemset(on_device.back().get(), 0, bytes);
      return on_device.back().get();
    }
#endif
    host.emplace_back(bytes);
    return host.back().data();
  }
};

void synchronize(dpa::Device device) {
#if defined(DPA_WITH_CUDA)
  if (device == dpa::Device::kCUDA) cudaDeviceSynchronize();
#else
  (void)device;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  dpa::Device device = dpa::Device::kCPU;
  int iters = 2000;
  int64_t keys = 1024;
  bool workspace = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device" && i + 1 < argc) {
      device = std::string(argv[++i]) == "cuda" ? dpa::Device::kCUDA : dpa::Device::kCPU;
    } else if (arg == "--iters" && i + 1 < argc) {
      iters = std::stoi(argv[++i]);
    } else if (arg == "--keys" && i + 1 < argc) {
      keys = std::stoll(argv[++i]);
    } else if (arg == "--workspace") {
      workspace = true;  // a preallocated block, as a caller's allocator would hand out
    } else {
      std::fprintf(
          stderr,
          "usage: call_overhead [--device cpu|cuda] [--iters N] [--keys N] [--workspace]\n");
      return 2;
    }
  }
  const dpa::DType dtype =
      device == dpa::Device::kCUDA ? dpa::DType::kBFloat16 : dpa::DType::kFloat32;
  Buffers buffers(device);
  auto tensor = [&](std::initializer_list<int64_t> shape, dpa::DType type) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    return dpa::TensorView::contiguous(buffers.make(size_t(count) * dpa::dtype_size(type)), type,
                                       shape, device);
  };
  dpa::ForwardArgs args;
  args.in.q = tensor({kBatch, kQueries, kHeads, kDim}, dtype);
  args.in.k = tensor({kBatch, keys, kHeads, kDim}, dtype);
  args.in.v = tensor({kBatch, keys, kHeads, kDim}, dtype);
  args.o = tensor({kBatch, kQueries, kHeads, kDim}, dtype);
  args.lse = tensor({kBatch, kHeads, kQueries}, dpa::DType::kFloat32);

  dpa::AttentionConfig config;
  config.mask_type = dpa::MaskType::kCausalBottomRight;
  config.softcap = 50.0;
  dpa::DotProductAttention attention(config);
  if (workspace) {
    const size_t bytes = attention.workspace_size(args);
    args.workspace.data = bytes ? buffers.make(bytes) : nullptr;
    args.workspace.bytes = bytes;
  }
  for (int i = 0; i < 50; ++i) attention.forward(args);  // warm-up: selection log, caches
  synchronize(device);

  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) attention.forward(args);
  const auto enqueued = std::chrono::steady_clock::now();
  synchronize(device);
  const auto done = std::chrono::steady_clock::now();
  auto us = [&](auto a, auto b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  std::printf(
      "{\"path\": \"c++\", \"device\": \"%s\", \"keys\": %lld, \"workspace\": %s, \"iters\": %d, "
      "\"host_us_per_call\": %.3f, \"wall_us_per_call\": %.3f}\n",
      device == dpa::Device::kCUDA ? "cuda" : "cpu", static_cast<long long>(keys),
      workspace ? "true" : "false", iters, us(start, enqueued) / iters, us(start, done) / iters);
  return 0;
}
