// The matrix kernels of the tiled CPU backend (declared in tiled_common.h).
//
// Their innermost loops run over a contiguous output dimension, so they vectorise without
// reassociating any sum. On x86-64 with GCC they are also compiled for AVX2 and picked at load
// time (target_clones): ~1.5x on the forward and ~1.8x on the backward over the SSE2 baseline.
// Each output element sees the same operations in the same order at any vector width, and the
// AVX2 clone does not enable FMA (no multiply-add contraction), so both clones give identical
// bits (checked: the same output hash from the SSE2 and AVX2 builds).

#include <cstring>

#include "cpu/tiled_common.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define DPA_CPU_KERNEL __attribute__((target_clones("avx2", "default")))
#else
#define DPA_CPU_KERNEL
#endif

namespace dpa::cpu {
namespace {

// Register blocks of 4 rows x 16 columns: eight 8-float accumulators (AVX2 registers; pairs of
// SSE registers in the baseline clone), so each loaded vector of the shared factor feeds four
// rows. GCC/Clang vector extensions keep the accumulators in registers; element-wise vector
// arithmetic does not change any element's summation order.
typedef float Vec8 __attribute__((vector_size(32)));
constexpr int64_t kBlockRows = 4;
constexpr int64_t kBlockCols = 16;

// Unaligned 8-float loads and stores (macros: a function returning a 32-byte vector would
// change the ABI between the clones, -Wpsabi).
#define DPA_LOAD8(vec, ptr) std::memcpy(&(vec), (ptr), sizeof(Vec8))
#define DPA_STORE8(ptr, vec) std::memcpy((ptr), &(vec), sizeof(Vec8))

}  // namespace

// c [m, n] = a [m, d] . bt [d, n] (bt is the right-hand factor already transposed).
// Every element is c_rc = (((0 + a_r0 bt_0c) + a_r1 bt_1c) + ...).
DPA_CPU_KERNEL void matmul_transposed(const float* a, const float* bt, int64_t m, int64_t n,
                                      int64_t d, float* c) {
  int64_t r0 = 0;
  for (; r0 + kBlockRows <= m; r0 += kBlockRows) {
    int64_t c0 = 0;
    for (; c0 + kBlockCols <= n; c0 += kBlockCols) {
      Vec8 acc[kBlockRows][2] = {};
      for (int64_t k = 0; k < d; ++k) {
        Vec8 b0, b1;
        DPA_LOAD8(b0, bt + k * n + c0);
        DPA_LOAD8(b1, bt + k * n + c0 + 8);
        for (int64_t rr = 0; rr < kBlockRows; ++rr) {
          const float factor = a[(r0 + rr) * d + k];
          acc[rr][0] += factor * b0;
          acc[rr][1] += factor * b1;
        }
      }
      for (int64_t rr = 0; rr < kBlockRows; ++rr) {
        DPA_STORE8(c + (r0 + rr) * n + c0, acc[rr][0]);
        DPA_STORE8(c + (r0 + rr) * n + c0 + 8, acc[rr][1]);
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

// c [m, d] += w [m, n] . x [n, d], summing over n in order. A column whose weights are all zero
// (masked or dropped pairs) is skipped.
DPA_CPU_KERNEL void accumulate_product(const float* w, const float* x, int64_t m, int64_t n,
                                       int64_t d, float* c) {
  int64_t r0 = 0;
  for (; r0 + kBlockRows <= m; r0 += kBlockRows) {
    int64_t k0 = 0;
    for (; k0 + kBlockCols <= d; k0 += kBlockCols) {
      Vec8 acc[kBlockRows][2];
      for (int64_t rr = 0; rr < kBlockRows; ++rr) {
        DPA_LOAD8(acc[rr][0], c + (r0 + rr) * d + k0);
        DPA_LOAD8(acc[rr][1], c + (r0 + rr) * d + k0 + 8);
      }
      for (int64_t col = 0; col < n; ++col) {
        const float w0 = w[r0 * n + col], w1 = w[(r0 + 1) * n + col];
        const float w2 = w[(r0 + 2) * n + col], w3 = w[(r0 + 3) * n + col];
        if (w0 == 0.0f && w1 == 0.0f && w2 == 0.0f && w3 == 0.0f) continue;
        Vec8 x0, x1;
        DPA_LOAD8(x0, x + col * d + k0);
        DPA_LOAD8(x1, x + col * d + k0 + 8);
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
        DPA_STORE8(c + (r0 + rr) * d + k0, acc[rr][0]);
        DPA_STORE8(c + (r0 + rr) * d + k0 + 8, acc[rr][1]);
      }
    }
    for (int64_t r = r0; r < r0 + kBlockRows && k0 < d; ++r) {
      for (int64_t col = 0; col < n; ++col) {
        const float weight = w[r * n + col];
        if (weight == 0.0f) continue;
        const float* xrow = x + col * d;
        for (int64_t k = k0; k < d; ++k) c[r * d + k] += weight * xrow[k];
      }
    }
  }
  for (int64_t r = r0; r < m; ++r) {
    for (int64_t col = 0; col < n; ++col) {
      const float weight = w[r * n + col];
      if (weight == 0.0f) continue;
      const float* xrow = x + col * d;
      for (int64_t k = 0; k < d; ++k) c[r * d + k] += weight * xrow[k];
    }
  }
}

// c [n, d] += w [m, n]^T . x [m, d], summing over m in order. A row whose weights for the
// block are all zero is skipped.
DPA_CPU_KERNEL void accumulate_transposed_product(const float* w, const float* x, int64_t m,
                                                  int64_t n, int64_t d, float* c) {
  int64_t c0 = 0;
  for (; c0 + kBlockRows <= n; c0 += kBlockRows) {
    int64_t k0 = 0;
    for (; k0 + kBlockCols <= d; k0 += kBlockCols) {
      Vec8 acc[kBlockRows][2];
      for (int64_t cc = 0; cc < kBlockRows; ++cc) {
        DPA_LOAD8(acc[cc][0], c + (c0 + cc) * d + k0);
        DPA_LOAD8(acc[cc][1], c + (c0 + cc) * d + k0 + 8);
      }
      for (int64_t r = 0; r < m; ++r) {
        const float* wrow = w + r * n + c0;
        const float w0 = wrow[0], w1 = wrow[1], w2 = wrow[2], w3 = wrow[3];
        if (w0 == 0.0f && w1 == 0.0f && w2 == 0.0f && w3 == 0.0f) continue;
        Vec8 x0, x1;
        DPA_LOAD8(x0, x + r * d + k0);
        DPA_LOAD8(x1, x + r * d + k0 + 8);
        acc[0][0] += w0 * x0;
        acc[0][1] += w0 * x1;
        acc[1][0] += w1 * x0;
        acc[1][1] += w1 * x1;
        acc[2][0] += w2 * x0;
        acc[2][1] += w2 * x1;
        acc[3][0] += w3 * x0;
        acc[3][1] += w3 * x1;
      }
      for (int64_t cc = 0; cc < kBlockRows; ++cc) {
        DPA_STORE8(c + (c0 + cc) * d + k0, acc[cc][0]);
        DPA_STORE8(c + (c0 + cc) * d + k0 + 8, acc[cc][1]);
      }
    }
    for (int64_t col = c0; col < c0 + kBlockRows && k0 < d; ++col) {
      for (int64_t r = 0; r < m; ++r) {
        const float weight = w[r * n + col];
        if (weight == 0.0f) continue;
        const float* xrow = x + r * d;
        for (int64_t k = k0; k < d; ++k) c[col * d + k] += weight * xrow[k];
      }
    }
  }
  for (int64_t col = c0; col < n; ++col) {
    for (int64_t r = 0; r < m; ++r) {
      const float weight = w[r * n + col];
      if (weight == 0.0f) continue;
      const float* xrow = x + r * d;
      for (int64_t k = 0; k < d; ++k) c[col * d + k] += weight * xrow[k];
    }
  }
}

}  // namespace dpa::cpu
