// The libFuzzer harnesses' shared pieces: a reader of the input's bytes, and host tensors
// allocated exactly as large as their views say (so that a read or write past a view that the
// validation let through is an ASan report).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dpa/tensor.h"

namespace dpa::fuzz {

// Consumes the input; past its end every read is 0.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t next() { return at_ < size_ ? data_[at_++] : 0; }
  int64_t below(int64_t n) { return n > 0 ? int64_t(next()) % n : 0; }
  int32_t signed_byte() { return int32_t(int8_t(next())); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

struct Tensor {
  std::vector<float> floats;
  std::vector<double> doubles;
  std::vector<int32_t> ints;
  std::vector<unsigned char> bools;
  TensorView view;
};

inline int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t extent : shape) n *= extent < 0 ? 0 : extent;
  return n;
}

// fp32 or fp64 elements, all `value`, row-major; with `pad` > 0, each step of dimension
// `pad_dim` skips `pad` more elements (a strided view with gaps, its last dimension still
// contiguous). The buffer ends at the view's last element.
inline Tensor floats(std::vector<int64_t> shape, float value, DType dtype = DType::kFloat32,
                     int pad_dim = -1, int64_t pad = 0) {
  Tensor t;
  const int ndim = int(shape.size());
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = ndim - 2; d >= 0; --d)
    strides[size_t(d)] = strides[size_t(d + 1)] * shape[size_t(d + 1)] + (d == pad_dim ? pad : 0);
  int64_t span = element_count(shape) > 0 ? 1 : 0;
  for (int d = 0; span > 0 && d < ndim; ++d) span += (shape[size_t(d)] - 1) * strides[size_t(d)];
  void* data = nullptr;
  if (dtype == DType::kFloat64) {
    t.doubles.assign(size_t(span), double(value));
    data = t.doubles.data();
  } else {
    t.floats.assign(size_t(span), value);
    data = t.floats.data();
  }
  t.view = TensorView::contiguous(data, dtype, shape.data(), ndim);
  for (int d = 0; d < ndim; ++d) t.view.strides[size_t(d)] = strides[size_t(d)];
  return t;
}

// The element offset of flat (row-major) index `flat` of a strided view.
inline int64_t offset_of(const TensorView& t, int64_t flat) {
  int64_t offset = 0;
  for (int d = t.ndim - 1; d >= 0; --d) {
    const int64_t extent = t.shape[size_t(d)];
    offset += (flat % extent) * t.strides[size_t(d)];
    flat /= extent;
  }
  return offset;
}

// int32 elements, each a signed byte of the input.
inline Tensor ints(std::vector<int64_t> shape, Bytes& bytes) {
  Tensor t;
  const int64_t n = element_count(shape);
  for (int64_t i = 0; i < n; ++i) t.ints.push_back(bytes.signed_byte());
  t.view = TensorView::contiguous(t.ints.data(), DType::kInt32, shape.data(), int(shape.size()));
  return t;
}

// Sequence boundaries [b + 1] from small lengths (their sum in *total), or arbitrary bytes,
// possibly not monotonic (*total then a small row count of its own).
inline Tensor boundaries(int64_t batch, Bytes& bytes, int64_t* total) {
  Tensor t;
  const bool arbitrary = bytes.below(4) == 0;
  int32_t sum = 0;
  t.ints.push_back(arbitrary ? bytes.signed_byte() : 0);
  for (int64_t i = 0; i < batch; ++i)
    t.ints.push_back(arbitrary ? bytes.signed_byte() : (sum += int32_t(bytes.below(6))));
  *total = arbitrary ? int64_t(bytes.below(24)) : sum;
  t.view = TensorView::contiguous(t.ints.data(), DType::kInt32, {batch + 1});
  return t;
}

}  // namespace dpa::fuzz
