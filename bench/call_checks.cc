// The host cost of a call's checks: validation, the memory-overlap checks, backend selection and
// the workspace's size (DotProductAttention::workspace_size, which a call runs before its
// backend's work), at gpt-oss's attention shape (b 2, 8192 positions, 64 query heads over 8 KV
// heads, d64, causal, a 128-key window, a learnable sink), forward and backward. Every GPU call
// pays this before its first kernel; a GPU is not needed: the views are host views whose
// addresses are never read, apart from the small sink vectors.
//
//   call_checks [--iters N]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dpa/attention.h"

namespace {

constexpr int64_t kBatch = 2, kSeq = 8192, kHeadsQ = 64, kHeadsKv = 8, kDim = 64;

// Distinct, page-aligned addresses that nothing reads: the checks compare address ranges only.
class FakeAddresses {
 public:
  dpa::TensorView view(std::initializer_list<int64_t> shape, dpa::DType dtype) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    void* data = reinterpret_cast<void*>(next_);
    next_ += (size_t(count) * dpa::dtype_size(dtype) + 4095) & ~size_t(4095);
    return dpa::TensorView::contiguous(data, dtype, shape, dpa::Device::kCPU);
  }

 private:
  uintptr_t next_ = uintptr_t(1) << 40;
};

template <typename Args>
double microseconds_per_check(const dpa::DotProductAttention& attention, const Args& args,
                              int iters) {
  size_t total = 0;  // keeps the calls from being optimised away
  for (int i = 0; i < iters / 10 + 1; ++i) total += attention.workspace_size(args);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) total += attention.workspace_size(args);
  const auto end = std::chrono::steady_clock::now();
  if (total == size_t(-1)) std::printf("unreachable\n");
  return std::chrono::duration<double, std::micro>(end - start).count() / iters;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20000;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--iters" && i + 1 < argc) {
      iters = std::stoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: call_checks [--iters N]\n");
      return 2;
    }
  }
  FakeAddresses memory;
  const dpa::DType bf16 = dpa::DType::kBFloat16;
  std::vector<float> sinks(kHeadsQ, 0.0f), d_sinks(kHeadsQ, 0.0f);
  dpa::ForwardArgs forward;
  forward.in.q = memory.view({kBatch, kSeq, kHeadsQ, kDim}, bf16);
  forward.in.k = memory.view({kBatch, kSeq, kHeadsKv, kDim}, bf16);
  forward.in.v = memory.view({kBatch, kSeq, kHeadsKv, kDim}, bf16);
  forward.in.softmax_offset =
      dpa::TensorView::contiguous(sinks.data(), dpa::DType::kFloat32, {kHeadsQ}, dpa::Device::kCPU);
  forward.o = memory.view({kBatch, kSeq, kHeadsQ, kDim}, bf16);
  forward.lse = memory.view({kBatch, kHeadsQ, kSeq}, dpa::DType::kFloat32);

  dpa::BackwardArgs backward;
  backward.in = forward.in;
  backward.o = forward.o;
  backward.lse = forward.lse;
  backward.d_o = memory.view({kBatch, kSeq, kHeadsQ, kDim}, bf16);
  backward.dq = memory.view({kBatch, kSeq, kHeadsQ, kDim}, bf16);
  backward.dk = memory.view({kBatch, kSeq, kHeadsKv, kDim}, bf16);
  backward.dv = memory.view({kBatch, kSeq, kHeadsKv, kDim}, bf16);
  backward.dsoftmax_offset = dpa::TensorView::contiguous(d_sinks.data(), dpa::DType::kFloat32,
                                                         {kHeadsQ}, dpa::Device::kCPU);

  dpa::AttentionConfig config;
  config.mask_type = dpa::MaskType::kCausalBottomRight;
  config.window_left = 127;
  config.window_right = 0;
  config.softmax_type = dpa::SoftmaxType::kLearnable;
  const dpa::DotProductAttention attention(config);
  std::printf(
      "{\"bench\": \"call_checks\", \"iters\": %d, \"forward_us\": %.3f, "
      "\"backward_us\": %.3f}\n",
      iters, microseconds_per_check(attention, forward, iters),
      microseconds_per_check(attention, backward, iters));
  return 0;
}
