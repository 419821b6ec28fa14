#include "cp/cp_layout.h"

#include <algorithm>
#include <cstring>

#include "core/element_access.h"
#include "cp/device_sets.h"

namespace dpa::cp {

Packed::Packed(DType type, int64_t r, int64_t h, int64_t d, Placement where)
    : dtype(type), rows(r), heads(h), dim(d), place(where) {
  if (place.on_device())
    device_ = allocate_device_bytes(size_bytes(), place);
  else
    host_.assign(size_bytes(), 0);
}

Packed::Packed(const Packed& other)
    : dtype(other.dtype), rows(other.rows), heads(other.heads), dim(other.dim), place(other.place) {
  if (place.on_device()) {
    device_ = allocate_device_bytes(size_bytes(), place);
    copy_bytes(device_.get(), other.data(), size_bytes(), place);
  } else {
    host_ = other.host_;
  }
}

Packed& Packed::operator=(const Packed& other) {
  if (this != &other) *this = Packed(other);
  return *this;
}

TensorView Packed::view(int64_t first, int64_t count) const {
  const size_t offset = size_t(first) * row_bytes();
  void* base = static_cast<unsigned char*>(const_cast<void*>(data())) + offset;
  TensorView v = TensorView::contiguous(base, dtype, {count, heads, dim}, place.device);
  v.device_index = place.on_device() ? place.index : 0;
  return v;
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

namespace {

// The row stride (elements) of a user-local tensor along its sequence axis.
int64_t local_row_stride(const Geometry& g, const TensorView& t) {
  return g.format == Format::kBSHD ? t.strides[1] : t.strides[0];
}

// Device sets: each (slot, sequence) block of rows is one 2-D copy per head (one for all heads
// when they are contiguous), `to_local` choosing the direction.
void copy_local_rows(const Geometry& g, const SideGeometry& side, const Packed& packed,
                     const TensorView& local, bool to_local) {
  const int64_t heads = packed.heads, dim = packed.dim;
  const int64_t head_stride = local.strides[local.ndim - 2];
  const size_t esize = dtype_size(local.dtype);
  const size_t local_pitch = size_t(local_row_stride(g, local)) * esize;
  const bool heads_together = head_stride == dim;
  auto* set = static_cast<unsigned char*>(const_cast<void*>(packed.data()));
  for (int64_t slot = 0; slot < 2; ++slot)
    for (int64_t b = 0; b < g.batch; ++b) {
      const int64_t rows = side.chunk[size_t(b)];
      auto* set_rows =
          set + size_t(slot * side.rows_per_chunk + side.prefix[size_t(b)]) * packed.row_bytes();
      auto* local_rows = static_cast<unsigned char*>(local.data) +
                         size_t(local_row_offset(g, side, local, b, slot * rows)) * esize;
      for (int64_t h = 0; h < (heads_together ? 1 : heads); ++h) {
        const size_t width = size_t(heads_together ? heads * dim : dim) * esize;
        unsigned char* set_at = set_rows + size_t(h * dim) * esize;
        unsigned char* local_at = local_rows + size_t(h * head_stride) * esize;
        if (to_local)
          copy_rows(local_at, local_pitch, set_at, packed.row_bytes(), width, size_t(rows),
                    packed.place);
        else
          copy_rows(set_at, packed.row_bytes(), local_at, local_pitch, width, size_t(rows),
                    packed.place);
      }
    }
}

}  // namespace

Packed pack_local(const Geometry& g, const SideGeometry& side, const TensorView& local,
                  const Placement& where) {
  const int64_t heads = local.shape[local.ndim - 2], dim = local.shape[local.ndim - 1];
  Packed out(local.dtype, 2 * side.rows_per_chunk, heads, dim, where);
  if (where.on_device()) {
    copy_local_rows(g, side, out, local, false);
    return out;
  }
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
  if (packed.place.on_device()) {
    if (packed.dtype == local.dtype)
      copy_local_rows(g, side, packed, local, true);
    else
      copy_local_rows(g, side, convert(packed, local.dtype), local, true);
    return;
  }
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

namespace {

// Device sets: LSE [.., H, rows] <-> [rows, H, 1], one strided copy per (slot, sequence).
void copy_lse_rows(const Geometry& g, const Packed& packed, const TensorView& local,
                   bool to_local) {
  const int64_t heads = packed.heads;
  const int64_t set_strides[2] = {heads, 1};  // (row, head)
  const int64_t local_strides[2] = {local.strides[local.ndim - 1], local.strides[local.ndim - 2]};
  auto* set = static_cast<float*>(const_cast<void*>(packed.data()));
  for (int64_t slot = 0; slot < 2; ++slot)
    for (int64_t b = 0; b < g.batch; ++b) {
      const int64_t rows = g.q.chunk[size_t(b)];
      float* set_at = set + (slot * g.q.rows_per_chunk + g.q.prefix[size_t(b)]) * heads;
      float* local_at = static_cast<float*>(local.data) + lse_offset(g, local, b, 0, slot * rows);
      if (to_local)
        copy_strided(local_at, local_strides, set_at, set_strides, rows, heads, packed.place);
      else
        copy_strided(set_at, set_strides, local_at, local_strides, rows, heads, packed.place);
    }
}

}  // namespace

Packed pack_lse(const Geometry& g, const TensorView& local, int64_t heads, const Placement& where) {
  Packed out(DType::kFloat32, 2 * g.q.rows_per_chunk, heads, 1, where);
  if (where.on_device()) {
    copy_lse_rows(g, out, local, false);
    return out;
  }
  float* data = out.f32();
  for_each_local_row(g, g.q, [&](int64_t row, int64_t b, int64_t local_row) {
    for (int64_t h = 0; h < heads; ++h)
      data[row * heads + h] = float(load(local, lse_offset(g, local, b, h, local_row)));
  });
  return out;
}

void unpack_lse(const Geometry& g, const Packed& packed, const TensorView& local) {
  if (packed.place.on_device()) {
    copy_lse_rows(g, packed, local, true);
    return;
  }
  const float* data = packed.f32();
  for_each_local_row(g, g.q, [&](int64_t row, int64_t b, int64_t local_row) {
    for (int64_t h = 0; h < packed.heads; ++h)
      store(local, lse_offset(g, local, b, h, local_row), data[row * packed.heads + h]);
  });
}

Packed split_heads(const Packed& in, int parts) {
  const int64_t part_heads = in.heads / parts;
  Packed out = Packed::alike(in, in.dtype, int64_t(parts) * in.rows, part_heads, in.dim);
  const size_t piece = size_t(part_heads * in.dim) * dtype_size(in.dtype);
  auto* dst = static_cast<unsigned char*>(out.data());
  const auto* src = static_cast<const unsigned char*>(in.data());
  if (in.place.on_device()) {
    for (int p = 0; p < parts; ++p)
      copy_rows(dst + size_t(p) * size_t(in.rows) * piece, piece, src + size_t(p) * piece,
                in.row_bytes(), piece, size_t(in.rows), in.place);
    return out;
  }
  for (int p = 0; p < parts; ++p)
    for (int64_t r = 0; r < in.rows; ++r)
      std::memcpy(dst + (size_t(p) * size_t(in.rows) + size_t(r)) * piece,
                  src + size_t(r) * in.row_bytes() + size_t(p) * piece, piece);
  return out;
}

Packed merge_heads(const Packed& in, int parts) {
  const int64_t rows = in.rows / parts;
  Packed out = Packed::alike(in, in.dtype, rows, in.heads * parts, in.dim);
  const size_t piece = in.row_bytes();
  auto* dst = static_cast<unsigned char*>(out.data());
  const auto* src = static_cast<const unsigned char*>(in.data());
  if (in.place.on_device()) {
    for (int p = 0; p < parts; ++p)
      copy_rows(dst + size_t(p) * piece, out.row_bytes(), src + size_t(p) * size_t(rows) * piece,
                piece, piece, size_t(rows), in.place);
    return out;
  }
  for (int p = 0; p < parts; ++p)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + size_t(r) * out.row_bytes() + size_t(p) * piece,
                  src + (size_t(p) * size_t(rows) + size_t(r)) * piece, piece);
  return out;
}

Packed replicate_heads(const Packed& in, int64_t factor) {
  Packed out = Packed::alike(in, in.dtype, in.rows, in.heads * factor, in.dim);
  const size_t head_bytes = size_t(in.dim) * dtype_size(in.dtype);
  auto* dst = static_cast<unsigned char*>(out.data());
  const auto* src = static_cast<const unsigned char*>(in.data());
  if (in.place.on_device()) {
    for (int64_t h = 0; h < out.heads; ++h)
      copy_rows(dst + size_t(h) * head_bytes, out.row_bytes(),
                src + size_t(h / factor) * head_bytes, in.row_bytes(), head_bytes, size_t(in.rows),
                in.place);
    return out;
  }
  for (int64_t r = 0; r < in.rows; ++r)
    for (int64_t h = 0; h < out.heads; ++h)
      std::memcpy(dst + size_t(r * out.heads + h) * head_bytes,
                  src + size_t(r * in.heads + h / factor) * head_bytes, head_bytes);
  return out;
}

Packed sum_replicas(const Packed& in, int64_t factor) {
  Packed out = Packed::alike(in, DType::kFloat32, in.rows, in.heads / factor, in.dim);
  if (in.place.on_device()) {
    // Replica k of head g is head g * factor + k: per k, a [G, rows, d] block with head stride d
    // (out) or factor * d (in).
    fill_device_f32(out.data(), 0.0f, out.numel(), in.place);
    for (int64_t k = 0; k < factor; ++k) {
      cuda::RowBlock acc{out.data(), out.heads, in.rows, in.dim, in.dim, out.heads * in.dim};
      cuda::RowBlock add{const_cast<float*>(static_cast<const float*>(in.data())) + k * in.dim,
                         out.heads,
                         in.rows,
                         in.dim,
                         factor * in.dim,
                         in.heads * in.dim};
      accumulate_device_rows(acc, add, DType::kFloat32, in.place);
    }
    return out;
  }
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
  Packed out = Packed::alike(in, dtype, in.rows, in.heads, in.dim);
  if (in.place.on_device()) {
    if (in.dtype == dtype)
      copy_bytes(out.data(), in.data(), in.size_bytes(), in.place);
    else if (in.dtype == DType::kFloat32)
      convert_device_rows(set_rows(out, 0, in.rows), dtype, set_rows(in, 0, in.rows), in.place);
    else
      throw Error(
          ErrorCode::kNotSupported, "dtype",
          "a device chunk set converts from fp32 only, got " + std::string(to_string(in.dtype)));
    return out;
  }
  for (int64_t n = 0; n < in.numel(); ++n)
    store_element(out.data(), dtype, n, load_element(in.data(), in.dtype, n));
  return out;
}

void accumulate_rows(Packed& dst, int64_t dst_row, const Packed& src, int64_t src_row,
                     int64_t count) {
  if (dst.place.on_device()) {
    accumulate_device_rows(set_rows(dst, dst_row, count), set_rows(src, src_row, count), src.dtype,
                           dst.place);
    return;
  }
  const int64_t width = src.heads * src.dim;
  float* out = dst.f32() + dst_row * width;
  for (int64_t n = 0; n < count * width; ++n)
    out[n] += float(load_element(src.data(), src.dtype, src_row * width + n));
}

void fill(Packed& set, float value) {
  if (set.place.on_device())
    fill_device_f32(set.data(), value, set.numel(), set.place);
  else
    std::fill(set.f32(), set.f32() + set.numel(), value);
}

}  // namespace dpa::cp
