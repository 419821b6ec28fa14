// Test support: owning host tensors, random inputs and error norms.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "dpa/tensor.h"

namespace dpa::test {

// An owning, contiguous host tensor with a TensorView onto it.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape);
  HostTensor(const HostTensor& other);
  HostTensor& operator=(const HostTensor& other);

  const TensorView& view() const { return view_; }
  TensorView& view() { return view_; }
  DType dtype() const { return view_.dtype; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return view_.numel(); }
  bool defined() const { return !bytes_.empty() || !shape_.empty(); }

  double get(int64_t flat) const;
  void set(int64_t flat, double value);
  std::vector<double> to_double() const;
  void fill(double value);

  // Normal(mean, stddev) values rounded to the storage dtype.
  static HostTensor randn(DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng,
                          double stddev = 1.0, double mean = 0.0);
  static HostTensor full(DType dtype, std::vector<int64_t> shape, double value);
  static HostTensor from_values(DType dtype, std::vector<int64_t> shape,
                                const std::vector<double>& values);

 private:
  void rebind();
  std::vector<int64_t> shape_;
  std::vector<unsigned char> bytes_;
  TensorView view_;
};

// |a - b| / |b| over all elements (Frobenius norms); +inf if any value is NaN.
double relative_error(const HostTensor& a, const HostTensor& b);
double max_abs_error(const HostTensor& a, const HostTensor& b);
// Whether a and b have the same shape and every element is equal or NaN in both (caches whose
// unused rows are NaN on purpose).
bool same_values(const HostTensor& a, const HostTensor& b);
double norm(const HostTensor& a);
bool has_nan(const HostTensor& a);

}  // namespace dpa::test
