#include "cp/cp_layout.h"

#include <cstring>

#include "core/element_access.h"

namespace dpa::cp {

TensorView Packed::view(int64_t first, int64_t count) const {
  const size_t offset = size_t(first) * row_bytes();
  void* base = const_cast<unsigned char*>(bytes.data()) + offset;
  return TensorView::contiguous(base, dtype, {count, heads, dim});
}

namespace {

// Offset of (b, local row, head 0) in a user-local [.., s, H, d] tensor.
int64_t local_row_offset(const Geometry& g, const SideGeometry& side, const TensorView& t,
                         int64_t b, int64_t row) {
  switch (g.format) {
    case Format::kBSHD:
      return b * t.strides[0] + row * t.strides[1];
    case Format::kSBHD:
      return row * t.strides[0] + b * t.strides[1];
    case Format::kTHD:
      return (side.local_start[size_t(b)] + row) * t.strides[0];
  }
  return 0;
}

// Calls fn(packed_row, b, local_row) for both slots of the rank's own set.
template <typename Fn>
void for_each_local_row(const Geometry& g, const SideGeometry& side, Fn&& fn) {
  for (int64_t slot = 0; slot < 2; ++slot)
    for (int64_t b = 0; b < g.batch; ++b)
      for (int64_t i = 0; i < side.chunk[size_t(b)]; ++i)
        fn(slot * side.rows_per_chunk + side.prefix[size_t(b)] + i, b,
           slot * side.chunk[size_t(b)] + i);
}

}  // namespace

Packed pack_local(const Geometry& g, const SideGeometry& side, const TensorView& local) {
  const int64_t heads = local.shape[local.ndim - 2], dim = local.shape[local.ndim - 1];
  Packed out(local.dtype, 2 * side.rows_per_chunk, heads, dim);
  const int64_t head_stride = local.strides[local.ndim - 2];
  const size_t esize = dtype_size(local.dtype);
  for_each_local_row(g, side, [&](int64_t row, int64_t b, int64_t local_row) {
    const int64_t base = local_row_offset(g, side, local, b, local_row);
    for (int64_t h = 0; h < heads; ++h)
      std::memcpy(
          static_cast<unsigned char*>(out.data()) + size_t((row * heads + h) * dim) * esize,
          static_cast<const unsigned char*>(local.data) + size_t(base + h * head_stride) * esize,
          size_t(dim) * esize);
  });
  return out;
}

void unpack_local(const Geometry& g, const SideGeometry& side, const Packed& packed,
                  const TensorView& local) {
  const int64_t heads = packed.heads, dim = packed.dim;
  const int64_t head_stride = local.strides[local.ndim - 2];
  for_each_local_row(g, side, [&](int64_t row, int64_t b, int64_t local_row) {
    const int64_t base = local_row_offset(g, side, local, b, local_row);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t c = 0; c < dim; ++c)
        store(local, base + h * head_stride + c,
              load_element(packed.data(), packed.dtype, (row * heads + h) * dim + c));
  });
}

namespace {
int64_t lse_offset(const Geometry& g, const TensorView& t, int64_t b, int64_t h, int64_t row) {
  if (g.format == Format::kTHD)
    return h * t.strides[0] + (g.q.local_start[size_t(b)] + row) * t.strides[1];
  return b * t.strides[0] + h * t.strides[1] + row * t.strides[2];
}
}  // namespace

Packed pack_lse(const Geometry& g, const TensorView& local, int64_t heads) {
  Packed out(DType::kFloat32, 2 * g.q.rows_per_chunk, heads, 1);
  float* data = out.f32();
  for_each_local_row(g, g.q, [&](int64_t row, int64_t b, int64_t local_row) {
    for (int64_t h = 0; h < heads; ++h)
      data[row * heads + h] = float(load(local, lse_offset(g, local, b, h, local_row)));
  });
  return out;
}

void unpack_lse(const Geometry& g, const Packed& packed, const TensorView& local) {
  const float* data = packed.f32();
  for_each_local_row(g, g.q, [&](int64_t row, int64_t b, int64_t local_row) {
    for (int64_t h = 0; h < packed.heads; ++h)
      store(local, lse_offset(g, local, b, h, local_row), data[row * packed.heads + h]);
  });
}

Packed split_heads(const Packed& in, int parts) {
  const int64_t part_heads = in.heads / parts;
  Packed out(in.dtype, int64_t(parts) * in.rows, part_heads, in.dim);
  const size_t piece = size_t(part_heads * in.dim) * dtype_size(in.dtype);
  auto* dst = static_cast<unsigned char*>(out.data());
  const auto* src = static_cast<const unsigned char*>(in.data());
  for (int p = 0; p < parts; ++p)
    for (int64_t r = 0; r < in.rows; ++r)
      std::memcpy(dst + (size_t(p) * size_t(in.rows) + size_t(r)) * piece,
                  src + size_t(r) * in.row_bytes() + size_t(p) * piece, piece);
  return out;
}

Packed merge_heads(const Packed& in, int parts) {
  const int64_t rows = in.rows / parts;
  Packed out(in.dtype, rows, in.heads * parts, in.dim);
  const size_t piece = in.row_bytes();
  auto* dst = static_cast<unsigned char*>(out.data());
  const auto* src = static_cast<const unsigned char*>(in.data());
  for (int p = 0; p < parts; ++p)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + size_t(r) * out.row_bytes() + size_t(p) * piece,
                  src + (size_t(p) * size_t(rows) + size_t(r)) * piece, piece);
  return out;
}

Packed replicate_heads(const Packed& in, int64_t factor) {
  Packed out(in.dtype, in.rows, in.heads * factor, in.dim);
  const size_t head_bytes = size_t(in.dim) * dtype_size(in.dtype);
  auto* dst = static_cast<unsigned char*>(out.data());
  const auto* src = static_cast<const unsigned char*>(in.data());
  for (int64_t r = 0; r < in.rows; ++r)
    for (int64_t h = 0; h < out.heads; ++h)
      std::memcpy(dst + size_t(r * out.heads + h) * head_bytes,
                  src + size_t(r * in.heads + h / factor) * head_bytes, head_bytes);
  return out;
}

Packed sum_replicas(const Packed& in, int64_t factor) {
  Packed out(DType::kFloat32, in.rows, in.heads / factor, in.dim);
  std::fill(out.f32(), out.f32() + out.numel(), 0.0f);
  const float* src = in.f32();
  for (int64_t r = 0; r < in.rows; ++r)
    for (int64_t h = 0; h < in.heads; ++h)
      for (int64_t c = 0; c < in.dim; ++c)
        out.f32()[(r * out.heads + h / factor) * in.dim + c] +=
            src[(r * in.heads + h) * in.dim + c];
  return out;
}

Packed convert(const Packed& in, DType dtype) {
  Packed out(dtype, in.rows, in.heads, in.dim);
  for (int64_t n = 0; n < in.numel(); ++n)
    store_element(out.data(), dtype, n, load_element(in.data(), in.dtype, n));
  return out;
}

void accumulate_rows(Packed& dst, int64_t dst_row, const Packed& src, int64_t src_row,
                     int64_t count) {
  const int64_t width = src.heads * src.dim;
  float* out = dst.f32() + dst_row * width;
  for (int64_t n = 0; n < count * width; ++n)
    out[n] += float(load_element(src.data(), src.dtype, src_row * width + n));
}

}  // namespace dpa::cp
