// The cpu backend's time per call (docs/cpu_backend.md): fp32 host tensors, bshd, b=1 H=8 G=2
// s=2048 d=64, causal, forward and forward + backward, the best of `--reps` calls each after one
// warm-up. Threads: DPA_NUM_THREADS (default: every core).
//
//   cpu_attention [--softcap C] [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dpa/attention.h"

namespace {

constexpr int64_t kBatch = 1, kSeq = 2048, kHeads = 8, kKvHeads = 2, kDim = 64;

// A host fp32 tensor of uniform values in [-1, 1) from a fixed linear congruential sequence.
struct Tensor {
  std::vector<float> values;
  dpa::TensorView view;
  Tensor(std::initializer_list<int64_t> shape, uint64_t seed) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    values.resize(size_t(count));
    for (float& v : values) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      v = float(seed >> 40) / float(1 << 23) - 1.0f;
    }
    view = dpa::TensorView::contiguous(values.data(), dpa::DType::kFloat32, shape);
  }
};

template <typename Call>
double best_seconds(int reps, Call call) {
  call();  // warm-up: the thread pool, the selection
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    call();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  double softcap = 0.0;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--softcap" && i + 1 < argc) {
      softcap = std::stod(argv[++i]);
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::stoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: cpu_attention [--softcap C] [--reps N]\n");
      return 2;
    }
  }
  Tensor q({kBatch, kSeq, kHeads, kDim}, 1), k({kBatch, kSeq, kKvHeads, kDim}, 2),
      v({kBatch, kSeq, kKvHeads, kDim}, 3), d_o({kBatch, kSeq, kHeads, kDim}, 4);
  Tensor o({kBatch, kSeq, kHeads, kDim}, 5), lse({kBatch, kHeads, kSeq}, 6);
  Tensor dq({kBatch, kSeq, kHeads, kDim}, 7), dk({kBatch, kSeq, kKvHeads, kDim}, 8),
      dv({kBatch, kSeq, kKvHeads, kDim}, 9);

  dpa::AttentionConfig config;
  config.mask_type = dpa::MaskType::kCausal;
  config.softcap = softcap;
  dpa::DotProductAttention attention(config);
  dpa::ForwardArgs forward;
  forward.in.q = q.view;
  forward.in.k = k.view;
  forward.in.v = v.view;
  forward.o = o.view;
  forward.lse = lse.view;
  dpa::BackwardArgs backward;
  backward.in = forward.in;
  backward.o = o.view;
  backward.lse = lse.view;
  backward.d_o = d_o.view;
  backward.dq = dq.view;
  backward.dk = dk.view;
  backward.dv = dv.view;

  const double forward_s = best_seconds(reps, [&] { attention.forward(forward); });
  const double both_s = best_seconds(reps, [&] {
    attention.forward(forward);
    attention.backward(backward);
  });
  std::printf("{\"softcap\": %g, \"forward_s\": %.4f, \"forward_backward_s\": %.4f}\n", softcap,
              forward_s, both_s);
  return 0;
}
