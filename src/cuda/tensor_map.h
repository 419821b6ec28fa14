// Host side of the bulk tensor copies (TMA): encodes the tensor map of a [batch, rows, heads, dim]
// tensor of 16-bit elements whose boxes are `box_rows` rows by 64 columns (128 bytes) with the
// 128-byte swizzle, the layout the wgmma kernels' shared tiles use (chunk c of row r at
// c ^ (r % 8)). Rows past `rows` read as zeros.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <optional>

#include "dpa/tensor.h"

namespace dpa::cuda {

// Elements are addressed as base + b * batch_stride + row * row_stride + h * head_stride + c
// (element strides; the last dimension is contiguous).
struct RowTensor {
  const void* base = nullptr;
  DType dtype = DType::kBFloat16;  // kBFloat16 or kFloat16
  int64_t batch = 0, rows = 0, heads = 0, dim = 0;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
};

// Whether TMA can address `tensor`: a 16-byte-aligned base, strides in multiples of 16 bytes,
// extents and strides within the encoder's limits.
bool tensor_map_can_address(const RowTensor& tensor);

// Encodes the map (2-byte elements; a box of 64 columns by `box_rows` rows, at most 256, by
// `box_heads` heads: shared memory receives the heads one after another), or nullopt when the
// driver has no encoder or refuses this layout: the caller then copies with cp.async, so a
// layout TMA cannot take never fails a call the selector accepted. Call tensor_map_can_address
// first.
std::optional<CUtensorMap> encode_row_tensor_map(const RowTensor& tensor, int box_rows,
                                                 int box_heads = 1);

}  // namespace dpa::cuda
