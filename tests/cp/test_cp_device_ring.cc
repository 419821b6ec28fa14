// Which calls the device-resident p2p ring takes (cp/device_ring.h). The ring itself runs only
// over NCCL on several GPUs (tests/nccl, docs/nccl.md); here, on the host, the eligibility rule
// that sends every other call to the general algorithms: a feature the ring does not implement
// must never reach it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cp/device_ring.h"
#include "dpa/error.h"
#include "dpa/nccl.h"

namespace dpa {
namespace {

// Shapes and placement only: device_ring_refusal reads no data.
struct RingCall {
  AttentionConfig config;
  CpConfig cp;
  AttentionInputs in;
  double dropout = 0.0;

  RingCall() {
    config.mask_type = MaskType::kCausal;
    config.softcap = 50.0;
    config.softmax_type = SoftmaxType::kLearnable;
    in.q = cuda_tensor({1, 4096, 16, 128});
    in.k = cuda_tensor({1, 4096, 4, 128});
    in.v = cuda_tensor({1, 4096, 4, 128});
    in.softmax_offset = cuda_tensor({16}, DType::kFloat32);
  }
  static TensorView cuda_tensor(std::initializer_list<int64_t> shape,
                                DType dtype = DType::kBFloat16) {
    return TensorView::contiguous(nullptr, dtype, shape, Device::kCUDA);
  }
  std::string refusal() const { return cp::device_ring_refusal(config, cp, in, dropout); }
};

// At every cp size, each rank meets every KV exactly once, and the dKV it holds at each step is
// the one of the KV it holds, arriving back with its owner after cp hops.
TEST(DeviceRingSchedule, EveryKvOnceAndEveryDkvHome) {
  for (int size = 1; size <= 8; ++size)
    for (int rank = 0; rank < size; ++rank) {
      const cp::Ring ring{rank, size};
      std::vector<int> met(size_t(size), 0);
      for (int step = 0; step < size; ++step) {
        ++met[size_t(ring.source(step))];
        // The dKV sent after this step is what the next rank holds at the next step.
        const cp::Ring next{ring.next(), size};
        EXPECT_EQ(next.source(step + 1), ring.source(step)) << "cp " << size << " rank " << rank;
        const cp::Ring previous{ring.previous(), size};
        EXPECT_EQ(previous.next(), rank);
      }
      for (int count : met) EXPECT_EQ(count, 1) << "cp " << size << " rank " << rank;
      EXPECT_EQ(ring.source(size), rank) << "after cp hops the dKV is home";
    }
}

// The ring's tiles cover exactly the visible (query, key) pairs of the unsharded causal (or
// unmasked) attention: for every cp size, rank and KV source, the pairs of the step's tile
// (with its local top-left causal mask) are those with key position <= query position.
TEST(DeviceRingSchedule, TilesCoverExactlyTheVisiblePairs) {
  for (int size = 1; size <= 8; ++size)
    for (bool causal : {true, false}) {
      const int64_t seqlen = 2 * size * 3;  // three rows per chunk
      const int64_t rows = seqlen / size;
      for (int rank = 0; rank < size; ++rank)
        for (int source = 0; source < size; ++source) {
          const std::vector<int64_t> q_pos = dual_chunk_positions(seqlen, size, rank);
          const std::vector<int64_t> k_pos = dual_chunk_positions(seqlen, size, source);
          const cp::StepTile tile = cp::step_tile(causal, rank, source, rows);
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < rows; ++j) {
              const bool visible = !causal || k_pos[size_t(j)] <= q_pos[size_t(i)];
              const bool in_tile = i >= tile.q_first && i < tile.q_first + tile.q_rows &&
                                   j >= tile.kv_first && j < tile.kv_first + tile.kv_rows &&
                                   (!tile.causal || j - tile.kv_first <= i - tile.q_first);
              EXPECT_EQ(in_tile, visible) << "cp " << size << " rank " << rank << " source "
                                          << source << " local row " << i << " key " << j;
            }
        }
    }
}

#if defined(DPA_WITH_CUDA)

TEST(DeviceRing, TakesTheTrainingCases) {
  RingCall causal_softcap_sink_gqa;
  EXPECT_EQ(causal_softcap_sink_gqa.refusal(), "");

  RingCall no_mask_sbhd;
  no_mask_sbhd.config.mask_type = MaskType::kNoMask;
  no_mask_sbhd.config.format = Format::kSBHD;
  no_mask_sbhd.in.q = RingCall::cuda_tensor({4096, 2, 16, 128});
  no_mask_sbhd.in.k = RingCall::cuda_tensor({4096, 2, 4, 128});
  no_mask_sbhd.in.v = RingCall::cuda_tensor({4096, 2, 4, 128});
  EXPECT_EQ(no_mask_sbhd.refusal(), "");

  RingCall mla_fp16_off_by_one;  // dqk 192, dv 128
  mla_fp16_off_by_one.config.softmax_type = SoftmaxType::kOffByOne;
  mla_fp16_off_by_one.in.softmax_offset = TensorView{};
  mla_fp16_off_by_one.in.q = RingCall::cuda_tensor({2, 2048, 8, 192}, DType::kFloat16);
  mla_fp16_off_by_one.in.k = RingCall::cuda_tensor({2, 2048, 8, 192}, DType::kFloat16);
  mla_fp16_off_by_one.in.v = RingCall::cuda_tensor({2, 2048, 8, 128}, DType::kFloat16);
  EXPECT_EQ(mla_fp16_off_by_one.refusal(), "");

  RingCall causal_bottom_right;  // equal lengths: the same mask as top-left causal
  causal_bottom_right.config.mask_type = MaskType::kCausalBottomRight;
  causal_bottom_right.config.window_right = 0;
  EXPECT_EQ(causal_bottom_right.refusal(), "");
}

// Each feature the ring does not implement is named in the refusal.
TEST(DeviceRing, RefusesWhatItDoesNotImplement) {
  auto expect_refused = [](const RingCall& call, const std::string& word) {
    const std::string reason = call.refusal();
    EXPECT_NE(reason.find(word), std::string::npos)
        << "expected a refusal naming '" << word << "', got '" << reason << "'";
  };
  RingCall c;
  c.in.q.device = c.in.k.device = c.in.v.device = Device::kCPU;
  expect_refused(c, "host tensors");

  for (CpCommType type : {CpCommType::kAllGather, CpCommType::kA2A, CpCommType::kA2AP2P}) {
    c = RingCall();
    c.cp.comm_type = type;
    expect_refused(c, std::string(to_string(type)));
  }
  c = RingCall();
  c.config.format = Format::kTHD;
  expect_refused(c, "thd");
  c = RingCall();
  c.in.cu_seqlens_q = RingCall::cuda_tensor({2}, DType::kInt32);
  expect_refused(c, "sequence tables");
  for (MaskType mask : {MaskType::kPadding, MaskType::kPaddingCausal, MaskType::kArbitrary}) {
    c = RingCall();
    c.config.mask_type = mask;
    expect_refused(c, "mask");
  }
  c = RingCall();
  c.config.window_left = 128;
  expect_refused(c, "sliding window");
  c = RingCall();  // without a causal mask, window_right = 0 is a window
  c.config.mask_type = MaskType::kNoMask;
  c.config.window_right = 0;
  expect_refused(c, "sliding window");
  c = RingCall();
  c.config.bias_type = BiasType::kPostScale;
  expect_refused(c, "bias");
  c = RingCall();
  c.in.alibi_slopes = RingCall::cuda_tensor({16}, DType::kFloat32);
  expect_refused(c, "ALiBi");
  c = RingCall();
  c.dropout = 0.1;
  expect_refused(c, "dropout");
  c = RingCall();
  for (TensorView* t : {&c.in.q, &c.in.k, &c.in.v}) t->dtype = DType::kFloat32;
  expect_refused(c, "dtype");
  c = RingCall();
  c.in.q.strides[1] *= 2;  // every other row
  expect_refused(c, "contiguous");
  c = RingCall();
  c.in.k.device_index = 1;
  expect_refused(c, "one GPU");
  c = RingCall();
  c.in.softmax_offset.device = Device::kCPU;
  expect_refused(c, "softmax_offset");
  c = RingCall();
  c.in.q.shape[1] = c.in.k.shape[1] = c.in.v.shape[1] = 4095;
  expect_refused(c, "odd");
}

// A communicator that must never be used: the calls below fail their checks first.
class UnusedNccl : public NcclCommunicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  CommHandle send(const void*, size_t, int, int) override { return posted(); }
  CommHandle recv(void*, size_t, int, int) override { return posted(); }
  CommHandle all_reduce(void*, int64_t, DType) override { return posted(); }
  CommHandle all_gather(const void*, void*, size_t) override { return posted(); }
  CommHandle reduce_scatter(const void*, void*, int64_t, DType) override { return posted(); }
  CommHandle all_to_all(const void*, void*, size_t) override { return posted(); }
  void start_pending() override {}
  void* stream() const override { return nullptr; }
  int device() const override { return 0; }
  void abort(const std::string&) override {}
  bool healthy() const override { return true; }

 private:
  static CommHandle posted() {
    ADD_FAILURE() << "a call with bad arguments posted a transfer";
    return nullptr;
  }
};

// Bad arguments of a call the ring takes are errors naming the argument, raised before any
// transfer, allocation or kernel (these run without a GPU: none of them may be reached).
TEST(DeviceRing, ChecksArgumentsBeforeTheFirstTransfer) {
  UnusedNccl comm;
  auto expect_error = [&](const RingCall& call, const ForwardArgs& args, const char* argument) {
    ASSERT_EQ(call.refusal(), "") << "the call must reach the ring";
    ContextParallelAttention attention(call.config, call.cp, comm);
    try {
      attention.forward(args);
      ADD_FAILURE() << "no error for " << argument;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  RingCall call;
  ForwardArgs args;
  args.in = call.in;
  args.o = RingCall::cuda_tensor({1, 4096, 16, 128});
  args.lse = RingCall::cuda_tensor({1, 16, 4096}, DType::kFloat32);

  ForwardArgs no_offsets = args;  // learnable sink without its offsets
  no_offsets.in.softmax_offset = TensorView{};
  RingCall learnable_without_offsets = call;
  learnable_without_offsets.in.softmax_offset = TensorView{};
  expect_error(learnable_without_offsets, no_offsets, "softmax_offset");

  ForwardArgs short_o = args;
  short_o.o = RingCall::cuda_tensor({1, 2048, 16, 128});
  expect_error(call, short_o, "o");

  ForwardArgs lse_fp16 = args;
  lse_fp16.lse.dtype = DType::kFloat16;
  expect_error(call, lse_fp16, "lse");

  RingCall other_gpu = call;  // the communicator is on device 0
  ForwardArgs on_gpu_1 = args;
  for (TensorView* t : {&on_gpu_1.in.q, &on_gpu_1.in.k, &on_gpu_1.in.v, &on_gpu_1.o, &on_gpu_1.lse,
                        &on_gpu_1.in.softmax_offset})
    t->device_index = 1;
  other_gpu.in = on_gpu_1.in;
  expect_error(other_gpu, on_gpu_1, "q");

  RingCall uneven_heads = call;  // 16 query heads over 5 KV heads
  ForwardArgs five_kv_heads = args;
  five_kv_heads.in.k = five_kv_heads.in.v = RingCall::cuda_tensor({1, 4096, 5, 128});
  uneven_heads.in = five_kv_heads.in;
  expect_error(uneven_heads, five_kv_heads, "k");
}

// A call the ring does not take (a window) goes to the device-resident general algorithms; CUDA
// tensors on another device than the communicator's are an error there too, not a slower path.
TEST(DeviceRing, TheGeneralAlgorithmsRefuseAnotherDeviceByName) {
  UnusedNccl comm;
  RingCall call;
  call.config.window_left = 255;
  ASSERT_NE(call.refusal(), "") << "the ring must not take a windowed call";
  ForwardArgs args;
  args.in = call.in;
  args.o = RingCall::cuda_tensor({1, 4096, 16, 128});
  args.lse = RingCall::cuda_tensor({1, 16, 4096}, DType::kFloat32);
  for (TensorView* t :
       {&args.in.q, &args.in.k, &args.in.v, &args.o, &args.lse, &args.in.softmax_offset})
    t->device_index = 1;
  ContextParallelAttention attention(call.config, call.cp, comm);
  try {
    attention.forward(args);
    ADD_FAILURE() << "a q on device 1 over a communicator on device 0 was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_EQ(e.argument(), "q") << e.what();
  }
}

#else

TEST(DeviceRing, NeedsCuda) { EXPECT_EQ(RingCall().refusal(), "a build without CUDA"); }

#endif

}  // namespace
}  // namespace dpa
