#include "support/host_tensor.h"

#include <cmath>
#include <limits>

#include "core/element_access.h"

namespace dpa::test {

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape) : shape_(std::move(shape)) {
  int64_t count = 1;
  for (int64_t extent : shape_) count *= extent;
  bytes_.assign(size_t(count) * dtype_size(dtype), 0);
  view_.dtype = dtype;
  rebind();
}

HostTensor::HostTensor(const HostTensor& other)
    : shape_(other.shape_), bytes_(other.bytes_), view_(other.view_) {
  rebind();
}

HostTensor& HostTensor::operator=(const HostTensor& other) {
  shape_ = other.shape_;
  bytes_ = other.bytes_;
  view_ = other.view_;
  rebind();
  return *this;
}

void HostTensor::rebind() {
  // Keep a non-null pointer for empty tensors: a defined view of zero elements.
  static unsigned char empty_storage[8];
  view_ = TensorView::contiguous(bytes_.empty() ? empty_storage : bytes_.data(), view_.dtype,
                                 shape_.data(), int(shape_.size()));
}

double HostTensor::get(int64_t flat) const { return load(view_, flat); }
void HostTensor::set(int64_t flat, double value) { store(view_, flat, value); }

std::vector<double> HostTensor::to_double() const {
  std::vector<double> values(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) values[size_t(i)] = get(i);
  return values;
}

void HostTensor::fill(double value) {
  for (int64_t i = 0; i < numel(); ++i) set(i, value);
}

HostTensor HostTensor::randn(DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng,
                             double stddev, double mean) {
  HostTensor t(dtype, std::move(shape));
  std::normal_distribution<double> normal(mean, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(rng));
  return t;
}

HostTensor HostTensor::full(DType dtype, std::vector<int64_t> shape, double value) {
  HostTensor t(dtype, std::move(shape));
  t.fill(value);
  return t;
}

HostTensor HostTensor::from_values(DType dtype, std::vector<int64_t> shape,
                                   const std::vector<double>& values) {
  HostTensor t(dtype, std::move(shape));
  for (int64_t i = 0; i < t.numel() && i < int64_t(values.size()); ++i) t.set(i, values[size_t(i)]);
  return t;
}

double norm(const HostTensor& a) {
  double sum = 0;
  for (int64_t i = 0; i < a.numel(); ++i) sum += a.get(i) * a.get(i);
  return std::sqrt(sum);
}

bool has_nan(const HostTensor& a) {
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::isnan(a.get(i))) return true;
  return false;
}

double relative_error(const HostTensor& a, const HostTensor& b) {
  if (a.numel() != b.numel() || has_nan(a) || has_nan(b))
    return std::numeric_limits<double>::infinity();
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a.get(i), y = b.get(i);
    // Equal infinities (e.g. LSE of empty rows) count as exact.
    double d = (x == y) ? 0.0 : x - y;
    diff += d * d;
    ref += std::isinf(y) ? 0.0 : y * y;
  }
  if (ref == 0) return std::sqrt(diff);
  return std::sqrt(diff / ref);
}

double max_abs_error(const HostTensor& a, const HostTensor& b) {
  if (a.numel() != b.numel() || has_nan(a) || has_nan(b))
    return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a.get(i), y = b.get(i);
    if (x == y) continue;
    worst = std::max(worst, std::fabs(x - y));
  }
  return worst;
}

bool same_values(const HostTensor& a, const HostTensor& b) {
  if (a.shape() != b.shape()) return false;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = b.get(i);
    if (x != y && !(std::isnan(x) && std::isnan(y))) return false;
  }
  return true;
}

}  // namespace dpa::test
