// What the TMA copies of the warp-specialised forward and the one-kernel backward accept
// (cuda/tensor_map.h, flash_forward_plan.h): host-side checks, no GPU needed. A layout TMA cannot
// address keeps the cp.async copies.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/problem.h"
#include "cuda/flash/flash_forward_plan.h"
#include "cuda/tensor_map.h"

namespace dpa::cuda {
namespace {

// bshd [2, 256, 4, 128] bf16, contiguous, at a 256-byte-aligned base.
RowTensor bshd() {
  alignas(256) static unsigned char storage[16];
  RowTensor t;
  t.base = storage;
  t.dtype = DType::kBFloat16;
  t.batch = 2;
  t.rows = 256;
  t.heads = 4;
  t.dim = 128;
  t.head_stride = 128;
  t.row_stride = 4 * 128;
  t.batch_stride = 256 * 4 * 128;
  return t;
}

TEST(TensorMap, AddressesContiguousSixteenBitLayouts) {
  EXPECT_TRUE(tensor_map_can_address(bshd()));
  RowTensor sbhd = bshd();  // [s, b, h, d]: the batch stride is below the row stride
  sbhd.batch_stride = 4 * 128;
  sbhd.row_stride = 2 * 4 * 128;
  EXPECT_TRUE(tensor_map_can_address(sbhd));
  RowTensor fp16 = bshd();
  fp16.dtype = DType::kFloat16;
  EXPECT_TRUE(tensor_map_can_address(fp16));
}

TEST(TensorMap, RefusesWhatTheCopyEngineCannotAddress) {
  RowTensor t = bshd();
  t.base = static_cast<const unsigned char*>(t.base) + 8;  // base off a 16-byte boundary
  EXPECT_FALSE(tensor_map_can_address(t));
  t = bshd();
  t.row_stride = 4 * 128 + 4;  // 8 bytes more per row: not a multiple of 16 bytes
  EXPECT_FALSE(tensor_map_can_address(t));
  t = bshd();
  t.head_stride = 0;  // a broadcast
  EXPECT_FALSE(tensor_map_can_address(t));
  t = bshd();
  t.dim = 96;  // not whole 64-column boxes
  EXPECT_FALSE(tensor_map_can_address(t));
  t = bshd();
  t.dtype = DType::kFloat32;
  EXPECT_FALSE(tensor_map_can_address(t));
}

TEST(TensorMap, EncodingNeverThrows) {
  // Without a driver (CI) there is no encoder: nullopt, and the plan keeps cp.async.
  EXPECT_NO_THROW((void)encode_row_tensor_map(bshd(), 128));
}

// TMA's zero fill stands in for cp.async's only where the rows past a sequence are past the
// tensor: a padded or packed sequence is followed by other data, which a tile would multiply by
// its masked zeros (NaN for a non-finite value there).
TEST(TensorMap, TakesOnlySequencesThatFillTheirTensorsRows) {
  AttentionProblem p;
  p.format = Format::kBSHD;
  p.batch = 2;
  p.max_seqlen_q = 256;
  p.max_seqlen_kv = 512;
  p.seqlen_q = {256, 256};
  p.seqlen_kv = {512, 512};
  EXPECT_TRUE(p.queries_fill_rows());
  EXPECT_TRUE(p.keys_fill_rows());
  p.format = Format::kSBHD;
  EXPECT_TRUE(p.queries_fill_rows());
  EXPECT_TRUE(p.keys_fill_rows());

  AttentionProblem padded = p;  // one padded sequence on each side
  padded.seqlen_q = {256, 200};
  padded.seqlen_kv = {511, 512};
  EXPECT_FALSE(padded.queries_fill_rows());
  EXPECT_FALSE(padded.keys_fill_rows());
  padded.seqlen_kv = {512, 512};  // the keys alone: the forward's TMA condition holds
  EXPECT_FALSE(padded.queries_fill_rows());
  EXPECT_TRUE(padded.keys_fill_rows());

  AttentionProblem packed = p;  // thd: each sequence is followed by the next one's rows
  packed.format = Format::kTHD;
  packed.batch = 1;
  packed.seqlen_q = {256};
  packed.seqlen_kv = {512};
  EXPECT_FALSE(packed.queries_fill_rows());
  EXPECT_FALSE(packed.keys_fill_rows());
}

}  // namespace
}  // namespace dpa::cuda
