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

// fp32 or fp64 elements, all `value`.
inline Tensor floats(std::vector<int64_t> shape, float value, DType dtype = DType::kFloat32) {
  Tensor t;
  const size_t n = size_t(element_count(shape));
  void* data = nullptr;
  if (dtype == DType::kFloat64) {
    t.doubles.assign(n, double(value));
    data = t.doubles.data();
  } else {
    t.floats.assign(n, value);
    data = t.floats.data();
  }
  t.view = TensorView::contiguous(data, dtype, shape.data(), int(shape.size()));
  return t;
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
