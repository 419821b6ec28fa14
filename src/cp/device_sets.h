// Device memory and copies for the CP chunk sets (cp_layout.h) that live on a GPU: the device-
// resident general algorithms (docs/context_parallel.md, "Device-resident algorithms"). Every
// copy is enqueued on the placement's stream. No CUDA headers; without CUDA each throws
// ErrorCode::kNotSupported.
#pragma once

#include <cstddef>
#include <memory>

#include "cp/cp_layout.h"
#include "cuda/cp_ring_ops.h"

namespace dpa::cp {

// `bytes` of device memory on the placement's device, stream-ordered on its stream (allocated
// and, when the last owner goes, freed there: work queued on that stream before the free still
// sees it; a communicator's work must be waited for first, or the stream ordered after it,
// as its handles require: CommRequest::wait_on_stream, cp::Transfers).
std::shared_ptr<void> allocate_device_bytes(size_t bytes, const Placement& where);

// dst <- src, `bytes` bytes: a memcpy for a host placement; else an asynchronous copy on its
// stream (either side host or device memory).
void copy_bytes(void* dst, const void* src, size_t bytes, const Placement& where);

// `height` rows of `width` bytes, rows `src_pitch` / `dst_pitch` bytes apart.
void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t height, const Placement& where);

// fp32 elements between two strided 2-D layouts (cuda/cp_ring_ops.h, copy_strided_f32).
void copy_strided(float* dst, const int64_t (&dst_strides)[2], const float* src,
                  const int64_t (&src_strides)[2], int64_t extent0, int64_t extent1,
                  const Placement& where);

// n fp32 values set to `value`.
void fill_device_f32(void* data, float value, int64_t n, const Placement& where);

// Waits for everything enqueued on the placement's stream.
void synchronize(const Placement& where);

// Rows [first, first + count) of a device set as a block of `count` one-row sequences: the
// layout every kernel of cuda/cp_ring_ops.h walks row by row, and whose [batch, heads, rows]
// LSE is then the set's [rows, H].
cuda::RowBlock set_rows(const Packed& set, int64_t first, int64_t count);

// The element operations of cuda/cp_ring_ops.h on the placement's device and stream (see
// there).
void accumulate_device_rows(const cuda::RowBlock& acc, const cuda::RowBlock& add, DType add_dtype,
                            const Placement& where);
void convert_device_rows(const cuda::RowBlock& dst, DType dst_dtype, const cuda::RowBlock& src,
                         const Placement& where);
void merge_device_rows(const cuda::RowBlock& o_acc, float* lse_acc, const cuda::RowBlock& o_tile,
                       DType tile_dtype, const float* lse_tile, int64_t heads,
                       const Placement& where);
void finalize_device_rows(const cuda::RowBlock& o, DType dtype, float* lse,
                          const cuda::RowBlock& o_acc, const float* lse_acc, int64_t heads,
                          int softmax_type, const float* offsets, const Placement& where);
void sink_gradient_device(float* dalpha, const cuda::RowBlock& o, const cuda::RowBlock& d_o,
                          DType dtype, const float* lse, int64_t heads, const float* offsets,
                          const Placement& where);
void add_tile_bias_gradient_device(float* out, const int64_t (&strides)[4], const float* tile,
                                   int64_t batch, int64_t heads, int64_t rows, int64_t cols,
                                   const int64_t* sequences, int64_t head_offset,
                                   const Placement& where);
// Work enqueued on `waiting` from now on runs after the placement's stream's work so far.
void order_after_device(void* waiting, const Placement& where);

}  // namespace dpa::cp
