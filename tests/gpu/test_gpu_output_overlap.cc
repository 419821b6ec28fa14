// Outputs that share memory with an input (core/memory_overlap.h) are refused for device tensors
// as for host ones, before any kernel runs: a forward with o = q names o and leaves q as it was,
// and a backward with dk = k names dk.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "dpa/attention.h"
#include "gpu/device_case.h"
#include "support/device_tensor.h"

namespace dpa::test {
namespace {

TEST(GpuOutputOverlap, OutputsOverInputsAreRefusedAndTheInputsKept) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << why;
  std::mt19937_64 rng(49);
  const HostTensor q = HostTensor::randn(DType::kBFloat16, {1, 64, 2, 64}, rng);
  const HostTensor k = HostTensor::randn(DType::kBFloat16, {1, 64, 2, 64}, rng);
  const HostTensor v = HostTensor::randn(DType::kBFloat16, {1, 64, 2, 64}, rng);
  const DeviceTensor q_device(q), k_device(k), v_device(v);
  DeviceTensor o(DType::kBFloat16, {1, 64, 2, 64}), lse(DType::kFloat32, {1, 2, 64});
  AttentionConfig config;
  config.mask_type = MaskType::kCausal;
  DotProductAttention attention(config);

  ForwardArgs forward;
  forward.in.q = q_device.view();
  forward.in.k = k_device.view();
  forward.in.v = v_device.view();
  forward.o = q_device.view();
  forward.lse = lse.view();
  try {
    attention.forward(forward);
    ADD_FAILURE() << "a forward with o = q ran";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    EXPECT_EQ(error.argument(), "o") << error.what();
  }
  EXPECT_EQ(max_abs_error(q_device.download(), q), 0.0);

  forward.o = o.view();
  const ForwardResult result = attention.forward(forward);  // the same call, apart: it runs
  DeviceTensor dq(DType::kBFloat16, {1, 64, 2, 64}), dv(DType::kBFloat16, {1, 64, 2, 64});
  const DeviceTensor d_o(v);
  try {
    attention.backward(
        backward_args_for(forward, result, d_o.view(), dq.view(), k_device.view(), dv.view()));
    ADD_FAILURE() << "a backward with dk = k ran";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    EXPECT_EQ(error.argument(), "dk") << error.what();
  }
  EXPECT_EQ(max_abs_error(k_device.download(), k), 0.0);
}

}  // namespace
}  // namespace dpa::test
