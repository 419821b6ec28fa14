// The CP chunk sets (src/cp/cp_layout.h) on the host: a copy is a separate buffer (the ring's
// receive buffers rely on it), alike() keeps the place, and views say where they live. Their
// device branches run in the GPU CP suite.
#include <gtest/gtest.h>

#include "cp/cp_layout.h"
#include "dpa/error.h"

namespace dpa::cp {
namespace {

TEST(CpLayout, ACopyOfASetIsASeparateBuffer) {
  Packed a(DType::kFloat32, 3, 2, 4);
  for (int64_t n = 0; n < a.numel(); ++n) a.f32()[n] = float(n);
  Packed b = a;
  EXPECT_NE(a.data(), b.data());
  b.f32()[0] = -1.0f;
  EXPECT_EQ(a.f32()[0], 0.0f);
  EXPECT_EQ(b.f32()[5], 5.0f);
  Packed c;
  c = a;
  EXPECT_NE(c.data(), a.data());
  EXPECT_EQ(c.f32()[23], 23.0f);
}

TEST(CpLayout, AlikeKeepsThePlaceAndStartsAtZeroOnTheHost) {
  Packed a(DType::kBFloat16, 2, 2, 8);
  const Packed b = Packed::alike(a, DType::kFloat32, 5, 1, 3);
  EXPECT_FALSE(b.place.on_device());
  EXPECT_EQ(b.size_bytes(), size_t(5 * 3) * sizeof(float));
  for (int64_t n = 0; n < b.numel(); ++n) EXPECT_EQ(b.f32()[n], 0.0f);
}

TEST(CpLayout, AViewIsTheRowsOfTheSetOnItsDevice) {
  Packed a(DType::kFloat16, 6, 2, 4);
  const TensorView v = a.view(2, 3);
  EXPECT_EQ(v.device, Device::kCPU);
  EXPECT_EQ(v.ndim, 3);
  EXPECT_EQ(v.shape[0], 3);
  EXPECT_EQ(v.shape[1], 2);
  EXPECT_EQ(v.shape[2], 4);
  EXPECT_EQ(static_cast<unsigned char*>(v.data) - static_cast<unsigned char*>(a.data()),
            2 * 2 * 4 * 2);
}

TEST(CpLayout, FillAndAccumulateOnTheHost) {
  Packed acc(DType::kFloat32, 4, 1, 2);
  fill(acc, 1.5f);
  Packed add(DType::kFloat32, 2, 1, 2);
  for (int64_t n = 0; n < add.numel(); ++n) add.f32()[n] = float(n);
  accumulate_rows(acc, 1, add, 0, 2);  // rows 1 and 2 of acc
  EXPECT_EQ(acc.f32()[0], 1.5f);
  EXPECT_EQ(acc.f32()[2], 1.5f);
  EXPECT_EQ(acc.f32()[3], 2.5f);
  EXPECT_EQ(acc.f32()[5], 4.5f);
  EXPECT_EQ(acc.f32()[6], 1.5f);
}

#if !defined(DPA_WITH_CUDA)
TEST(CpLayout, ADeviceSetNeedsCuda) {
  try {
    Packed a(DType::kFloat32, 1, 1, 1, Placement{Device::kCUDA, 0, nullptr});
    FAIL() << "a device set was made without CUDA";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotSupported);
  }
}
#endif

}  // namespace
}  // namespace dpa::cp
