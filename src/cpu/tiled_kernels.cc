// The vector kernels of the tiled CPU backend (declared in tiled_common.h): three matrix
// products, the softcap's tanh, and the softmax's exponential, maximum and sum.
//
// Each kernel works on register blocks of 4 rows x 2 vectors: eight vector accumulators, so
// every loaded vector of the shared factor feeds four rows and the accumulators stay in
// registers (GCC/Clang vector extensions). The vector width W is 8 floats (AVX2) when the CPU
// has it, chosen once at run time, and 4 (SSE2, NEON) otherwise. Vector arithmetic is
// element-wise, so every output element sees the same operations in the same order at either
// width, and the AVX2 build does not enable FMA (no multiply-add contraction): both paths give
// identical bits (tests/cpu/test_cpu_vector_kernels.cc checks the softmax kernels' bits at both
// widths). Timings: docs/cpu_backend.md.
#include <cstring>

#include "core/float_convert.h"
#include "cpu/tiled_common.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DPA_CPU_AVX2_DISPATCH 1
#endif

#define DPA_ALWAYS_INLINE inline __attribute__((always_inline))

namespace dpa::cpu {
namespace {

template <int W>
struct VecOf;
template <>
struct VecOf<4> {
  typedef float type __attribute__((vector_size(16)));
};
template <>
struct VecOf<8> {
  typedef float type __attribute__((vector_size(32)));
};
// The 32-bit integer vector of the same width (casts between the two reinterpret the bits).
template <int W>
struct IntVecOf {
  typedef int32_t type __attribute__((vector_size(4 * W)));
};

constexpr int64_t kBlockRows = 4;

// Unaligned vector loads and stores. Macros, not functions: a function taking or returning a
// 32-byte vector would have a different ABI with and without AVX (-Wpsabi).
#define DPA_LOAD_VEC(vec, ptr) std::memcpy(&(vec), (ptr), sizeof(vec))
#define DPA_STORE_VEC(ptr, vec) std::memcpy((ptr), &(vec), sizeof(vec))

// c [m, n] = a [m, d] . bt [d, n] (bt is the right-hand factor already transposed).
// Every element is c_rc = (((0 + a_r0 bt_0c) + a_r1 bt_1c) + ...).
template <int W>
DPA_ALWAYS_INLINE void matmul_transposed_impl(const float* a, const float* bt, int64_t m, int64_t n,
                                              int64_t d, float* c) {
  using Vec = typename VecOf<W>::type;
  int64_t r0 = 0;
  for (; r0 + kBlockRows <= m; r0 += kBlockRows) {
    int64_t c0 = 0;
    for (; c0 + 2 * W <= n; c0 += 2 * W) {
      // Zeroed one by one: GCC zeroes an aggregate initialiser through the stack (`rep stos`),
      // which cost a tenth of this kernel's time (perf, session 38).
      Vec acc[kBlockRows][2];
      for (int64_t rr = 0; rr < kBlockRows; ++rr) acc[rr][0] = acc[rr][1] = Vec{};
      for (int64_t k = 0; k < d; ++k) {
        Vec b0, b1;
        DPA_LOAD_VEC(b0, bt + k * n + c0);
        DPA_LOAD_VEC(b1, bt + k * n + c0 + W);
        for (int64_t rr = 0; rr < kBlockRows; ++rr) {
          const float factor = a[(r0 + rr) * d + k];
          acc[rr][0] += factor * b0;
          acc[rr][1] += factor * b1;
        }
      }
      for (int64_t rr = 0; rr < kBlockRows; ++rr) {
        DPA_STORE_VEC(c + (r0 + rr) * n + c0, acc[rr][0]);
        DPA_STORE_VEC(c + (r0 + rr) * n + c0 + W, acc[rr][1]);
      }
    }
    for (int64_t r = r0; r < r0 + kBlockRows && c0 < n; ++r) {
      float* crow = c + r * n;
      for (int64_t col = c0; col < n; ++col) crow[col] = 0.0f;
      for (int64_t k = 0; k < d; ++k) {
        const float factor = a[r * d + k];
        const float* brow = bt + k * n;
        for (int64_t col = c0; col < n; ++col) crow[col] += factor * brow[col];
      }
    }
  }
  for (int64_t r = r0; r < m; ++r) {
    float* crow = c + r * n;
    for (int64_t col = 0; col < n; ++col) crow[col] = 0.0f;
    for (int64_t k = 0; k < d; ++k) {
      const float factor = a[r * d + k];
      const float* brow = bt + k * n;
      for (int64_t col = 0; col < n; ++col) crow[col] += factor * brow[col];
    }
  }
}

// c [rows, d] += W . x [inner, d], summing over the inner index in order, with the weight of
// (row i, inner j) at w[i * row_stride + j * inner_stride]: both products below are this one
// with their strides. A block of rows whose weights for an inner index are all zero (masked or
// dropped pairs) skips it.
template <int W>
DPA_ALWAYS_INLINE void accumulate_strided_impl(const float* w, int64_t row_stride,
                                               int64_t inner_stride, const float* x, int64_t rows,
                                               int64_t inner, int64_t d, float* c) {
  using Vec = typename VecOf<W>::type;
  auto weight = [&](int64_t i, int64_t j) { return w[i * row_stride + j * inner_stride]; };
  int64_t r0 = 0;
  for (; r0 + kBlockRows <= rows; r0 += kBlockRows) {
    int64_t k0 = 0;
    for (; k0 + 2 * W <= d; k0 += 2 * W) {
      Vec acc[kBlockRows][2];
      for (int64_t rr = 0; rr < kBlockRows; ++rr) {
        DPA_LOAD_VEC(acc[rr][0], c + (r0 + rr) * d + k0);
        DPA_LOAD_VEC(acc[rr][1], c + (r0 + rr) * d + k0 + W);
      }
      for (int64_t j = 0; j < inner; ++j) {
        const float w0 = weight(r0, j), w1 = weight(r0 + 1, j);
        const float w2 = weight(r0 + 2, j), w3 = weight(r0 + 3, j);
        // All four +-0 iff their bits but the signs are 0: integer operations, where four float
        // compares (each NaN-aware) took about 40% of this kernel's time (perf, session 38).
        if (((float_to_bits(w0) | float_to_bits(w1) | float_to_bits(w2) | float_to_bits(w3))
             << 1) == 0)
          continue;
        Vec x0, x1;
        DPA_LOAD_VEC(x0, x + j * d + k0);
        DPA_LOAD_VEC(x1, x + j * d + k0 + W);
        acc[0][0] += w0 * x0;
        acc[0][1] += w0 * x1;
        acc[1][0] += w1 * x0;
        acc[1][1] += w1 * x1;
        acc[2][0] += w2 * x0;
        acc[2][1] += w2 * x1;
        acc[3][0] += w3 * x0;
        acc[3][1] += w3 * x1;
      }
      for (int64_t rr = 0; rr < kBlockRows; ++rr) {
        DPA_STORE_VEC(c + (r0 + rr) * d + k0, acc[rr][0]);
        DPA_STORE_VEC(c + (r0 + rr) * d + k0 + W, acc[rr][1]);
      }
    }
    for (int64_t r = r0; r < r0 + kBlockRows && k0 < d; ++r) {
      for (int64_t j = 0; j < inner; ++j) {
        const float wij = weight(r, j);
        if (wij == 0.0f) continue;
        const float* xrow = x + j * d;
        for (int64_t k = k0; k < d; ++k) c[r * d + k] += wij * xrow[k];
      }
    }
  }
  for (int64_t r = r0; r < rows; ++r) {
    for (int64_t j = 0; j < inner; ++j) {
      const float wij = weight(r, j);
      if (wij == 0.0f) continue;
      const float* xrow = x + j * d;
      for (int64_t k = 0; k < d; ++k) c[r * d + k] += wij * xrow[k];
    }
  }
}

// c [m, d] += w [m, n] . x [n, d], summing over n in order.
template <int W>
DPA_ALWAYS_INLINE void accumulate_product_impl(const float* w, const float* x, int64_t m, int64_t n,
                                               int64_t d, float* c) {
  accumulate_strided_impl<W>(w, n, 1, x, m, n, d, c);
}

// c [n, d] += w [m, n]^T . x [m, d], summing over m in order.
template <int W>
DPA_ALWAYS_INLINE void accumulate_transposed_product_impl(const float* w, const float* x, int64_t m,
                                                          int64_t n, int64_t d, float* c) {
  accumulate_strided_impl<W>(w, 1, n, x, n, m, d, c);
}

// exp(y) for each element of a vector (exp_of_shifted). Range reduction
// exp(y) = 2^n exp(r) with n = round(y log2 e) and r = y - n ln 2 (ln 2 in two parts, the first
// short enough that n times it is exact), then exp(r) for |r| <= ln 2 / 2 by its Taylor
// polynomial of degree 7 (truncation below 2^-27 relative), times 2^n as two powers of two
// built in the exponent bits (so that n = 128 still reaches +inf by rounding, as exp does):
// within 2 ulp of the exact exp (1.22 at worst over every float argument, measured
// exhaustively; the unit test checks 2 on a sample) and about 4x faster than a library call per
// element. y below log(2^-126) (denormal results) gives 0, -inf included (masked logits), and no
// operation produces a denormal there, which would cost a microcode assist on some CPUs; +inf
// stays +inf and NaN stays NaN.
template <int W>
DPA_ALWAYS_INLINE void exp_in_place(typename VecOf<W>::type& y) {
  using Vec = typename VecOf<W>::type;
  using IntVec = typename IntVecOf<W>::type;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2High = 0.693359375f;  // 355 / 512: n * kLn2High is exact for |n| < 2^15
  constexpr float kLn2Low = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;   // 1.5 * 2^23: adding and subtracting rounds to an integer
  constexpr float kLowest = -87.336544f;  // log(2^-126): results below are denormals
  constexpr float kHighest = 88.75f;      // exp(88.75) overflows
  const IntVec underflow = y < kLowest;   // NaN compares false and is kept
  const IntVec overflow = y > kHighest;
  const IntVec lowest = IntVec(Vec{} + kLowest), highest = IntVec(Vec{} + kHighest);
  const Vec clamped =
      Vec((IntVec(y) & ~(underflow | overflow)) | (lowest & underflow) | (highest & overflow));
  // n in the low mantissa bits of the rounded sum, read as an integer difference of bit patterns
  // (no float-to-int conversion, which a NaN lane would make undefined).
  const Vec rounded = clamped * kLog2e + kRound, whole = rounded - kRound;
  const Vec r = (clamped - whole * kLn2High) - whole * kLn2Low;
  Vec poly = r * (1.0f / 5040.0f) + (1.0f / 720.0f);
  poly = poly * r + (1.0f / 120.0f);
  poly = poly * r + (1.0f / 24.0f);
  poly = poly * r + (1.0f / 6.0f);
  poly = poly * r + 0.5f;
  poly = poly * r + 1.0f;
  poly = poly * r + 1.0f;
  const IntVec power = IntVec(rounded) - IntVec(Vec{} + kRound), half = power >> 1;
  const Vec value = poly * Vec((half + 127) << 23) * Vec((power - half + 127) << 23);
  y = Vec(IntVec(value) & ~underflow);
}

// tanh(y) for each element of a vector (tanh_of_scaled). Both forms are computed for every element
// and one is kept: for |y| < 0.625 the odd Taylor series of tanh to y^19 (truncation below 2^-27
// relative), above it 1 - 2 / (exp(2|y|) + 1) with exp_in_place (where the subtraction loses under
// one bit); the sign is y's. Within 2 ulp of the exact tanh (the unit test checks); +-inf give +-1,
// NaN stays NaN, -0 stays -0.
template <int W>
DPA_ALWAYS_INLINE void tanh_in_place(typename VecOf<W>::type& y) {
  using Vec = typename VecOf<W>::type;
  using IntVec = typename IntVecOf<W>::type;
  const IntVec sign = IntVec(y) & (IntVec{} + int32_t(0x80000000u));
  const Vec a = Vec(IntVec(y) & ~sign);
  const Vec z = a * a;
  Vec series = z * -2.3912911424355248e-4f + 5.9002744094558598e-4f;  // y^19, y^17
  series = series * z + -1.4558343870513183e-3f;                      // y^15
  series = series * z + 3.5921280365724810e-3f;                       // y^13
  series = series * z + -8.8632355299021966e-3f;                      // y^11
  series = series * z + 2.1869488536155203e-2f;                       // y^9
  series = series * z + -5.3968253968253968e-2f;                      // y^7
  series = series * z + 1.3333333333333333e-1f;                       // y^5
  series = series * z + -3.3333333333333333e-1f;                      // y^3
  const Vec small = a + a * z * series;
  Vec exp_of_twice = a + a;
  exp_in_place<W>(exp_of_twice);
  const Vec large = 1.0f - 2.0f / (exp_of_twice + 1.0f);
  const IntVec use_series = a < 0.625f;
  y = Vec(((IntVec(small) & use_series) | (IntVec(large) & ~use_series)) | sign);
}

// The elementwise maps of exp_of_shifted and tanh_of_scaled: Op::apply<W>(vector, argument) on
// W elements at a time; the last partial vector is padded, so every element takes the same
// operations at either width (and the same bits).
struct ShiftedExp {
  template <int W>
  static DPA_ALWAYS_INLINE void apply(typename VecOf<W>::type& y, float shift) {
    y -= shift;
    exp_in_place<W>(y);
  }
};
struct ScaledTanh {
  template <int W>
  static DPA_ALWAYS_INLINE void apply(typename VecOf<W>::type& y, float scale) {
    y *= scale;
    tanh_in_place<W>(y);
  }
};

template <int W, typename Op>
DPA_ALWAYS_INLINE void map_vector(float* p, float argument) {
  typename VecOf<W>::type y;
  DPA_LOAD_VEC(y, p);
  Op::template apply<W>(y, argument);
  DPA_STORE_VEC(p, y);
}

template <int W, typename Op>
DPA_ALWAYS_INLINE void map_in_place(float* x, int64_t n, float argument) {
  int64_t i = 0;
  for (; i + W <= n; i += W) map_vector<W, Op>(x + i, argument);
  if (i < n) {
    float tail[W] = {};
    std::memcpy(tail, x + i, sizeof(float) * size_t(n - i));
    map_vector<W, Op>(tail, argument);
    std::memcpy(x + i, tail, sizeof(float) * size_t(n - i));
  }
}

// The largest of x[0 .. n), NaN if any is NaN (a NaN logit must reach o and lse instead of
// reading as a masked key), -inf for n = 0. A maximum is exact, so the order does not matter.
template <int W>
DPA_ALWAYS_INLINE float max_keeping_nan_impl(const float* x, int64_t n) {
  using Vec = typename VecOf<W>::type;
  using IntVec = typename IntVecOf<W>::type;
  Vec best = Vec{} - __builtin_huge_valf();
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    Vec v;
    DPA_LOAD_VEC(v, x + i);
    const IntVec take = (v > best) | (v != v);
    best = Vec((IntVec(v) & take) | (IntVec(best) & ~take));
  }
  float result = -__builtin_huge_valf();
  for (int lane = 0; lane < W; ++lane) result = keep_nan_max(result, best[lane]);
  for (; i < n; ++i) result = keep_nan_max(result, x[i]);
  return result;
}

// x[0] + ... + x[n - 1] in a fixed order at either width: eight lane sums (lane l adds x[l],
// x[l + 8], ... in turn; the last partial block padded with zeros), then ((l0 + l1) + (l2 + l3))
// + ((l4 + l5) + (l6 + l7)). Eight chains instead of one sequential chain of n dependent adds.
template <int W>
DPA_ALWAYS_INLINE float sum_in_lanes_impl(const float* x, int64_t n) {
  using Vec = typename VecOf<W>::type;
  constexpr int kParts = 8 / W;
  Vec lanes[kParts] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int part = 0; part < kParts; ++part) {
      Vec v;
      DPA_LOAD_VEC(v, x + i + part * W);
      lanes[part] += v;
    }
  }
  if (i < n) {
    float tail[8] = {};
    std::memcpy(tail, x + i, sizeof(float) * size_t(n - i));
    for (int part = 0; part < kParts; ++part) {
      Vec v;
      DPA_LOAD_VEC(v, tail + part * W);
      lanes[part] += v;
    }
  }
  float l[8];
  for (int part = 0; part < kParts; ++part) DPA_STORE_VEC(l + part * W, lanes[part]);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

}  // namespace

#if defined(DPA_CPU_AVX2_DISPATCH)
namespace {

bool cpu_has_avx2() {
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  return has_avx2;
}

__attribute__((target("avx2"))) void matmul_transposed_avx2(const float* a, const float* bt,
                                                            int64_t m, int64_t n, int64_t d,
                                                            float* c) {
  matmul_transposed_impl<8>(a, bt, m, n, d, c);
}
__attribute__((target("avx2"))) void accumulate_product_avx2(const float* w, const float* x,
                                                             int64_t m, int64_t n, int64_t d,
                                                             float* c) {
  accumulate_product_impl<8>(w, x, m, n, d, c);
}
__attribute__((target("avx2"))) void accumulate_transposed_product_avx2(const float* w,
                                                                        const float* x, int64_t m,
                                                                        int64_t n, int64_t d,
                                                                        float* c) {
  accumulate_transposed_product_impl<8>(w, x, m, n, d, c);
}

__attribute__((target("avx2"))) void exp_of_shifted_avx2(float* x, int64_t n, float shift) {
  map_in_place<8, ShiftedExp>(x, n, shift);
}
__attribute__((target("avx2"))) void tanh_of_scaled_avx2(float* x, int64_t n, float scale) {
  map_in_place<8, ScaledTanh>(x, n, scale);
}
__attribute__((target("avx2"))) float max_keeping_nan_avx2(const float* x, int64_t n) {
  return max_keeping_nan_impl<8>(x, n);
}
__attribute__((target("avx2"))) float sum_in_lanes_avx2(const float* x, int64_t n) {
  return sum_in_lanes_impl<8>(x, n);
}

}  // namespace
#endif

void matmul_transposed(const float* a, const float* bt, int64_t m, int64_t n, int64_t d, float* c) {
#if defined(DPA_CPU_AVX2_DISPATCH)
  if (cpu_has_avx2()) return matmul_transposed_avx2(a, bt, m, n, d, c);
#endif
  matmul_transposed_impl<4>(a, bt, m, n, d, c);
}

void accumulate_product(const float* w, const float* x, int64_t m, int64_t n, int64_t d, float* c) {
#if defined(DPA_CPU_AVX2_DISPATCH)
  if (cpu_has_avx2()) return accumulate_product_avx2(w, x, m, n, d, c);
#endif
  accumulate_product_impl<4>(w, x, m, n, d, c);
}

void accumulate_transposed_product(const float* w, const float* x, int64_t m, int64_t n, int64_t d,
                                   float* c) {
#if defined(DPA_CPU_AVX2_DISPATCH)
  if (cpu_has_avx2()) return accumulate_transposed_product_avx2(w, x, m, n, d, c);
#endif
  accumulate_transposed_product_impl<4>(w, x, m, n, d, c);
}

void exp_of_shifted(float* x, int64_t n, float shift) {
#if defined(DPA_CPU_AVX2_DISPATCH)
  if (cpu_has_avx2()) return exp_of_shifted_avx2(x, n, shift);
#endif
  map_in_place<4, ShiftedExp>(x, n, shift);
}

void exp_of_shifted_portable(float* x, int64_t n, float shift) {
  map_in_place<4, ShiftedExp>(x, n, shift);
}

void tanh_of_scaled(float* x, int64_t n, float scale) {
#if defined(DPA_CPU_AVX2_DISPATCH)
  if (cpu_has_avx2()) return tanh_of_scaled_avx2(x, n, scale);
#endif
  map_in_place<4, ScaledTanh>(x, n, scale);
}

void tanh_of_scaled_portable(float* x, int64_t n, float scale) {
  map_in_place<4, ScaledTanh>(x, n, scale);
}

float max_keeping_nan(const float* x, int64_t n) {
#if defined(DPA_CPU_AVX2_DISPATCH)
  if (cpu_has_avx2()) return max_keeping_nan_avx2(x, n);
#endif
  return max_keeping_nan_impl<4>(x, n);
}

float sum_in_lanes(const float* x, int64_t n) {
#if defined(DPA_CPU_AVX2_DISPATCH)
  if (cpu_has_avx2()) return sum_in_lanes_avx2(x, n);
#endif
  return sum_in_lanes_impl<4>(x, n);
}

float sum_in_lanes_portable(const float* x, int64_t n) { return sum_in_lanes_impl<4>(x, n); }

}  // namespace dpa::cpu
