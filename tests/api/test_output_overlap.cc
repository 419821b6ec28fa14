// Outputs that share memory with inputs or with each other (core/memory_overlap.h): the
// provable cases are refused naming the output, before anything is written; interleaved views
// of one packed tensor (q, k, v or dq, dk, dv as slices of [b, s, 3, H, d]) still run, and give
// what separate tensors give.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "core/memory_overlap.h"
#include "dpa/attention.h"

namespace dpa {
namespace {

constexpr double kSentinel = 4321.0;
constexpr int64_t kB = 2, kS = 5, kH = 2, kD = 4;

TensorView strided(double* data, std::vector<int64_t> shape, std::vector<int64_t> strides) {
  TensorView t;
  t.data = data;
  t.dtype = DType::kFloat64;
  t.ndim = int(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    t.shape[d] = shape[d];
    t.strides[d] = strides[d];
  }
  return t;
}

// A [b, s, H, d] view of `data` from element `offset`, its rows `row_stride` apart.
TensorView rows(std::vector<double>& data, int64_t offset = 0, int64_t row_stride = kH * kD) {
  return strided(data.data() + offset, {kB, kS, kH, kD}, {kS * row_stride, row_stride, kD, 1});
}

std::vector<double> values(int64_t n, double phase) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = std::sin(0.37 * double(i) + phase);
  return v;
}

TEST(OutputOverlap, TellsDenseViewsAndProvableSharing) {
  std::vector<double> buffer(kB * kS * 3 * kH * kD);
  const TensorView whole = rows(buffer);
  EXPECT_TRUE(is_dense(whole));
  // sbhd's order of the same bytes: dense, whatever the order of the dimensions.
  EXPECT_TRUE(is_dense(strided(buffer.data(), {kS, kB, kH, kD}, {kH * kD, kS * kH * kD, kD, 1})));
  const TensorView q = rows(buffer, 0, 3 * kH * kD), k = rows(buffer, kH * kD, 3 * kH * kD);
  EXPECT_FALSE(is_dense(q));
  EXPECT_TRUE(byte_range(q).intersects(byte_range(k)));
  EXPECT_FALSE(provably_share_memory(q, k));  // interleaved: undecided, left to the caller
  EXPECT_TRUE(provably_share_memory(q, q));   // the same first element
  EXPECT_TRUE(provably_share_memory(whole, strided(buffer.data() + 7, {3}, {1})));
  EXPECT_FALSE(provably_share_memory(whole, strided(buffer.data() + whole.numel(), {3}, {1})));
  // A view walked backwards spans the bytes below its first element; it is not taken as dense
  // (negative strides are left undecided), so only its first element proves sharing.
  const TensorView reversed = strided(buffer.data() + 9, {10}, {-1});
  EXPECT_EQ(byte_range(reversed).begin, reinterpret_cast<uintptr_t>(buffer.data()));
  EXPECT_EQ(byte_range(reversed).end, reinterpret_cast<uintptr_t>(buffer.data() + 10));
  EXPECT_FALSE(is_dense(reversed));
  EXPECT_TRUE(provably_share_memory(reversed, strided(buffer.data() + 9, {2}, {1})));
  EXPECT_FALSE(provably_share_memory(reversed, strided(buffer.data(), {2}, {1})));
  EXPECT_FALSE(provably_share_memory(whole, TensorView{}));  // undefined: no element
  // Offsets past 64 bits span no memory a process has: undecided, never refused.
  const TensorView huge = strided(buffer.data(), {3, 2}, {int64_t(1) << 62, 1});
  EXPECT_TRUE(byte_range(huge).empty());
  EXPECT_TRUE(provably_share_memory(huge, whole));  // still the same first element
  EXPECT_FALSE(provably_share_memory(huge, strided(buffer.data() + 1, {2}, {1})));
}

// One call's buffers: separate tensors, which each case then aliases.
struct Buffers {
  std::vector<double> q = values(kB * kS * kH * kD, 0.1), k = values(kB * kS * kH * kD, 0.7),
                      v = values(kB * kS * kH * kD, 1.3), d_o = values(kB * kS * kH * kD, 2.1);
  std::vector<double> o = std::vector<double>(kB * kS * kH * kD, kSentinel);
  std::vector<float> lse = std::vector<float>(kB * kH * kS, float(kSentinel));
  std::vector<double> dq = std::vector<double>(kB * kS * kH * kD, kSentinel),
                      dk = std::vector<double>(kB * kS * kH * kD, kSentinel),
                      dv = std::vector<double>(kB * kS * kH * kD, kSentinel);

  ForwardArgs forward() {
    ForwardArgs args;
    args.in.q = rows(q);
    args.in.k = rows(k);
    args.in.v = rows(v);
    args.o = rows(o);
    args.lse = TensorView::contiguous(lse.data(), DType::kFloat32, {kB, kH, kS});
    return args;
  }
  BackwardArgs backward() {
    BackwardArgs args = backward_args_for(forward(), {}, rows(d_o), rows(dq), rows(dk), rows(dv));
    return args;
  }
};

// The first 256-byte boundary at or after `data`.
void* aligned_inside(double* data) {
  const auto at = reinterpret_cast<uintptr_t>(data);
  return reinterpret_cast<void*>((at + 255) & ~uintptr_t(255));
}

struct Overlap {
  std::string name, argument;
  bool backward;
  std::function<void(Buffers&, ForwardArgs&, BackwardArgs&)> alias;
};

void PrintTo(const Overlap& overlap, std::ostream* os) { *os << overlap.name; }

class RefusedOverlap : public ::testing::TestWithParam<Overlap> {};

TEST_P(RefusedOverlap, NamesTheOutputAndWritesNothing) {
  const Overlap& c = GetParam();
  Buffers b;
  ForwardArgs forward = b.forward();
  BackwardArgs backward = b.backward();
  c.alias(b, forward, backward);
  const Buffers before = b;
  AttentionConfig config;
  config.backend = BackendKind::kCpuExact;
  DotProductAttention attention(config);
  try {
    if (c.backward)
      attention.backward(backward);
    else
      attention.forward(forward);
    FAIL() << "no error for " << c.name;
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    EXPECT_EQ(error.argument(), c.argument) << error.what();
  }
  EXPECT_EQ(b.q, before.q);
  EXPECT_EQ(b.k, before.k);
  EXPECT_EQ(b.o, before.o);
  EXPECT_EQ(b.lse, before.lse);
  EXPECT_EQ(b.dq, before.dq);
  EXPECT_EQ(b.dk, before.dk);
  EXPECT_EQ(b.dv, before.dv);
}

INSTANTIATE_TEST_SUITE_P(
    Outputs, RefusedOverlap,
    ::testing::Values(
        Overlap{"o_is_q", "o", false,
                [](Buffers& b, ForwardArgs& f, BackwardArgs&) { f.o = rows(b.q); }},
        // o's last rows are k's first: the byte ranges of two dense views meet.
        Overlap{"o_runs_into_k", "o", false,
                [](Buffers& b, ForwardArgs& f, BackwardArgs&) {
                  b.k.resize(3 * b.k.size());
                  f.in.k = rows(b.k, 2 * kB * kS * kH * kD);
                  f.in.v = rows(b.v);
                  f.o = rows(b.k, kB * kS * kH * kD + 8);
                }},
        Overlap{"lse_inside_o", "lse", false,
                [](Buffers& b, ForwardArgs& f, BackwardArgs&) {
                  TensorView lse = f.lse;
                  lse.data = b.o.data();
                  f.lse = lse;
                }},
        Overlap{"o_expanded_over_heads", "o", false,
                [](Buffers& b, ForwardArgs& f, BackwardArgs&) {
                  f.o = strided(b.o.data(), {kB, kS, kH, kD}, {kS * kH * kD, kH * kD, 0, 1});
                }},
        // The caller's workspace block is the call's to write whole (on the 256-byte boundary
        // a workspace needs, inside the tensor's 640 bytes).
        Overlap{"workspace_over_o", "workspace", false,
                [](Buffers& b, ForwardArgs& f, BackwardArgs&) {
                  f.workspace.data = aligned_inside(b.o.data());
                  f.workspace.bytes = 256;
                }},
        Overlap{"workspace_over_dk", "workspace", true,
                [](Buffers& b, ForwardArgs&, BackwardArgs& g) {
                  g.workspace.data = aligned_inside(b.dk.data());
                  g.workspace.bytes = 256;
                }},
        Overlap{"dq_is_q", "dq", true,
                [](Buffers& b, ForwardArgs&, BackwardArgs& g) { g.dq = rows(b.q); }},
        Overlap{"dk_is_o", "dk", true,
                [](Buffers& b, ForwardArgs&, BackwardArgs& g) { g.dk = rows(b.o); }},
        Overlap{"dv_is_dk", "dv", true,
                [](Buffers& b, ForwardArgs&, BackwardArgs& g) { g.dv = rows(b.dk); }},
        Overlap{"dq_over_lse", "dq", true,
                [](Buffers& b, ForwardArgs&, BackwardArgs& g) {
                  g.dq = rows(b.dq);
                  g.lse.data = b.dq.data() + 3;
                }}),
    [](const ::testing::TestParamInfo<Overlap>& info) { return info.param.name; });

// q, k, v as the three interleaved slices of one [b, s, 3, H, d] tensor, and o, dq, dk, dv the
// same way in their own packed tensors: byte ranges that intersect, elements that do not.
TEST(OutputOverlap, RunsInterleavedSlicesOfPackedTensors) {
  AttentionConfig config;
  config.backend = BackendKind::kCpuExact;
  config.mask_type = MaskType::kCausal;
  const int64_t packed_row = 3 * kH * kD;

  Buffers separate;
  DotProductAttention reference(config);
  ForwardArgs forward = separate.forward();
  const ForwardResult result = reference.forward(forward);
  reference.backward(backward_args_for(forward, result, rows(separate.d_o), rows(separate.dq),
                                       rows(separate.dk), rows(separate.dv)));

  std::vector<double> qkv(kB * kS * packed_row), grads(kB * kS * packed_row, kSentinel);
  std::vector<double> o_and_d_o(kB * kS * 2 * kH * kD);
  for (int64_t r = 0; r < kB * kS; ++r)
    for (int64_t e = 0; e < kH * kD; ++e) {
      const size_t at = size_t(r * kH * kD + e);
      qkv[size_t(r * packed_row + e)] = separate.q[at];
      qkv[size_t(r * packed_row + kH * kD + e)] = separate.k[at];
      qkv[size_t(r * packed_row + 2 * kH * kD + e)] = separate.v[at];
      o_and_d_o[size_t(r * 2 * kH * kD + kH * kD + e)] = separate.d_o[at];
    }
  std::vector<float> lse(kB * kH * kS);
  ForwardArgs packed;
  packed.in.q = rows(qkv, 0, packed_row);
  packed.in.k = rows(qkv, kH * kD, packed_row);
  packed.in.v = rows(qkv, 2 * kH * kD, packed_row);
  packed.o = rows(o_and_d_o, 0, 2 * kH * kD);  // o beside d_o in one buffer
  packed.lse = TensorView::contiguous(lse.data(), DType::kFloat32, {kB, kH, kS});
  DotProductAttention attention(config);
  const ForwardResult packed_result = attention.forward(packed);
  attention.backward(backward_args_for(packed, packed_result, rows(o_and_d_o, kH * kD, 2 * kH * kD),
                                       rows(grads, 0, packed_row), rows(grads, kH * kD, packed_row),
                                       rows(grads, 2 * kH * kD, packed_row)));

  for (int64_t r = 0; r < kB * kS; ++r)
    for (int64_t e = 0; e < kH * kD; ++e) {
      const size_t at = size_t(r * kH * kD + e);
      ASSERT_EQ(o_and_d_o[size_t(r * 2 * kH * kD + e)], separate.o[at]);
      ASSERT_EQ(grads[size_t(r * packed_row + e)], separate.dq[at]);
      ASSERT_EQ(grads[size_t(r * packed_row + kH * kD + e)], separate.dk[at]);
      ASSERT_EQ(grads[size_t(r * packed_row + 2 * kH * kD + e)], separate.dv[at]);
    }
  EXPECT_EQ(lse, separate.lse);
}

}  // namespace
}  // namespace dpa
