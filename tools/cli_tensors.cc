#include "cli_tensors.h"

#include <cmath>
#include <limits>

#include "core/element_access.h"

namespace dpa::cli {

npy::Array convert(const npy::Array& array, DType dtype) {
  npy::Array out(dtype, array.shape);
  const int64_t count = array.numel();
  for (int64_t i = 0; i < count; ++i) {
    store_element(out.bytes.data(), dtype, i, load_element(array.bytes.data(), array.dtype, i));
  }
  return out;
}

npy::Array random_normal(DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng,
                         double stddev, double mean) {
  npy::Array out(dtype, std::move(shape));
  std::normal_distribution<double> normal(mean, stddev);
  const int64_t count = out.numel();
  for (int64_t i = 0; i < count; ++i) store_element(out.bytes.data(), dtype, i, normal(rng));
  return out;
}

int qkv_rank(Format format) { return format == Format::kTHD ? 3 : 4; }

std::vector<int64_t> output_shape(const std::vector<int64_t>& q_shape,
                                  const std::vector<int64_t>& v_shape) {
  std::vector<int64_t> shape = q_shape;
  if (!shape.empty() && !v_shape.empty()) shape.back() = v_shape.back();
  return shape;
}

std::vector<int64_t> lse_shape(Format format, const std::vector<int64_t>& q) {
  switch (format) {
    case Format::kBSHD:
      return {q[0], q[2], q[1]};
    case Format::kSBHD:
      return {q[1], q[2], q[0]};
    case Format::kTHD:
      return {q[1], q[0]};
  }
  return {};
}

ErrorNorms compare(const npy::Array& actual, const npy::Array& reference) {
  ErrorNorms norms;
  if (actual.numel() != reference.numel()) {
    norms.max_abs = norms.relative = std::numeric_limits<double>::infinity();
    return norms;
  }
  double diff_squares = 0, ref_squares = 0;
  bool nan = false;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    double a = load_element(actual.bytes.data(), actual.dtype, i);
    double r = load_element(reference.bytes.data(), reference.dtype, i);
    if (std::isnan(a) || std::isnan(r)) {
      nan = true;
      continue;
    }
    double d = (a == r) ? 0.0 : a - r;
    norms.max_abs = std::max(norms.max_abs, std::fabs(d));
    diff_squares += d * d;
    ref_squares += std::isinf(r) ? 0.0 : r * r;
  }
  if (nan) {
    norms.max_abs = norms.relative = std::numeric_limits<double>::infinity();
    return norms;
  }
  norms.relative =
      ref_squares > 0 ? std::sqrt(diff_squares / ref_squares) : std::sqrt(diff_squares);
  return norms;
}

}  // namespace dpa::cli
