// Host-array helpers shared by the dpa tool's commands: dtype conversion, random data, output
// shapes and error norms. Arrays are npy::Array (owning, contiguous).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "dpa/types.h"
#include "npy.h"

namespace dpa::cli {

// A converted copy (values go through double, rounding to the target dtype).
npy::Array convert(const npy::Array& array, DType dtype);

// Normal(mean, stddev) values rounded to `dtype`.
npy::Array random_normal(DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng,
                         double stddev = 1.0, double mean = 0.0);

// Expected rank of q/k/v for a format: 4 for bshd/sbhd, 3 for thd.
int qkv_rank(Format format);
// o: like q with the head dim of v.
std::vector<int64_t> output_shape(const std::vector<int64_t>& q_shape,
                                  const std::vector<int64_t>& v_shape);
// lse: [b, H, sq] for bshd/sbhd, [H, t] for thd.
std::vector<int64_t> lse_shape(Format format, const std::vector<int64_t>& q_shape);

struct ErrorNorms {
  double max_abs = 0;   // max |a - b|
  double relative = 0;  // |a - b| / |b| (Frobenius); inf if anything is NaN
};
// Compares equal-sized arrays of any floating dtype; equal infinities count as exact.
ErrorNorms compare(const npy::Array& actual, const npy::Array& reference);

}  // namespace dpa::cli
