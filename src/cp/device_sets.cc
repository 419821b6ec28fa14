#include "cp/device_sets.h"

#include <cstring>

#include "dpa/error.h"

#if defined(DPA_WITH_CUDA)
#include <cuda_runtime.h>

#include "cuda/cp_ring_ops.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/runtime.h"
#endif

namespace dpa::cp {

cuda::RowBlock set_rows(const Packed& set, int64_t first, int64_t count) {
  const int64_t width = set.heads * set.dim;
  cuda::RowBlock block;
  block.data = static_cast<unsigned char*>(const_cast<void*>(set.data())) +
               size_t(first * width) * dtype_size(set.dtype);
  block.batch = count;
  block.rows = 1;
  block.width = width;
  block.batch_stride = width;
  block.row_stride = width;
  return block;
}

#if defined(DPA_WITH_CUDA)

std::shared_ptr<void> allocate_device_bytes(size_t bytes, const Placement& where) {
  const cuda::DeviceGuard guard(where.index);
  auto memory = std::make_shared<cuda::DeviceBuffer>(
      cuda::DeviceBuffer::stream_ordered(bytes, static_cast<cudaStream_t>(where.stream)));
  void* data = memory->get();
  return std::shared_ptr<void>(memory, data);  // aliasing: owns the buffer
}

void copy_bytes(void* dst, const void* src, size_t bytes, const Placement& where) {
  if (bytes == 0) return;
  if (!where.on_device()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const cuda::DeviceGuard guard(where.index);
  DPA_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(where.stream)));
}

void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t height, const Placement& where) {
  if (width == 0 || height == 0) return;
  const cuda::DeviceGuard guard(where.index);
  DPA_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDefault,
                                   static_cast<cudaStream_t>(where.stream)));
}

void copy_strided(float* dst, const int64_t (&dst_strides)[2], const float* src,
                  const int64_t (&src_strides)[2], int64_t extent0, int64_t extent1,
                  const Placement& where) {
  const cuda::DeviceGuard guard(where.index);
  cuda::copy_strided_f32(dst, dst_strides, src, src_strides, extent0, extent1, where.stream);
}

void fill_device_f32(void* data, float value, int64_t n, const Placement& where) {
  if (n == 0) return;
  const cuda::DeviceGuard guard(where.index);
  cuda::fill_f32(static_cast<float*>(data), value, n, where.stream);
}

void synchronize(const Placement& where) { cuda::synchronize(where.stream, where.index); }

void accumulate_device_rows(const cuda::RowBlock& acc, const cuda::RowBlock& add, DType add_dtype,
                            const Placement& where) {
  const cuda::DeviceGuard guard(where.index);
  cuda::accumulate_rows(acc, add, add_dtype, where.stream);
}

void convert_device_rows(const cuda::RowBlock& dst, DType dst_dtype, const cuda::RowBlock& src,
                         const Placement& where) {
  const cuda::DeviceGuard guard(where.index);
  cuda::convert_rows(dst, dst_dtype, src, where.stream);
}

void merge_device_rows(const cuda::RowBlock& o_acc, float* lse_acc, const cuda::RowBlock& o_tile,
                       DType tile_dtype, const float* lse_tile, int64_t heads,
                       const Placement& where) {
  const cuda::DeviceGuard guard(where.index);
  cuda::merge_partial_rows(o_acc, lse_acc, o_acc.rows, 0, o_tile, tile_dtype, lse_tile, heads,
                           where.stream);
}

void finalize_device_rows(const cuda::RowBlock& o, DType dtype, float* lse,
                          const cuda::RowBlock& o_acc, const float* lse_acc, int64_t heads,
                          int softmax_type, const float* offsets, const Placement& where) {
  const cuda::DeviceGuard guard(where.index);
  cuda::finalize_forward_rows(o, dtype, lse, o_acc, lse_acc, heads, softmax_type, offsets,
                              where.stream);
}

void sink_gradient_device(float* dalpha, const cuda::RowBlock& o, const cuda::RowBlock& d_o,
                          DType dtype, const float* lse, int64_t heads, const float* offsets,
                          const Placement& where) {
  const cuda::DeviceGuard guard(where.index);
  cuda::sink_gradient(dalpha, o, d_o, dtype, lse, heads, offsets, where.stream);
}

void add_tile_bias_gradient_device(float* out, const int64_t (&strides)[4], const float* tile,
                                   int64_t batch, int64_t heads, int64_t rows, int64_t cols,
                                   const int64_t* sequences, int64_t head_offset,
                                   const Placement& where) {
  const cuda::DeviceGuard guard(where.index);
  cuda::add_tile_bias_gradient(out, strides, tile, batch, heads, rows, cols, sequences, head_offset,
                               where.stream);
}

void order_after_device(void* waiting, const Placement& where) {
  const cuda::DeviceGuard guard(where.index);
  cuda::order_after(waiting, where.stream);
}

#else

namespace {
Error no_cuda() {
  return Error(ErrorCode::kNotSupported, "device",
               "dpa was built without CUDA: chunk sets cannot live on a GPU");
}
}  // namespace

std::shared_ptr<void> allocate_device_bytes(size_t, const Placement&) { throw no_cuda(); }
void copy_bytes(void* dst, const void* src, size_t bytes, const Placement& where) {
  if (where.on_device()) throw no_cuda();
  if (bytes != 0) std::memcpy(dst, src, bytes);
}
void copy_rows(void*, size_t, const void*, size_t, size_t, size_t, const Placement&) {
  throw no_cuda();
}
void copy_strided(float*, const int64_t (&)[2], const float*, const int64_t (&)[2], int64_t,
                  int64_t, const Placement&) {
  throw no_cuda();
}
void fill_device_f32(void*, float, int64_t, const Placement&) { throw no_cuda(); }
void synchronize(const Placement&) { throw no_cuda(); }
void accumulate_device_rows(const cuda::RowBlock&, const cuda::RowBlock&, DType, const Placement&) {
  throw no_cuda();
}
void convert_device_rows(const cuda::RowBlock&, DType, const cuda::RowBlock&, const Placement&) {
  throw no_cuda();
}
void merge_device_rows(const cuda::RowBlock&, float*, const cuda::RowBlock&, DType, const float*,
                       int64_t, const Placement&) {
  throw no_cuda();
}
void finalize_device_rows(const cuda::RowBlock&, DType, float*, const cuda::RowBlock&, const float*,
                          int64_t, int, const float*, const Placement&) {
  throw no_cuda();
}
void sink_gradient_device(float*, const cuda::RowBlock&, const cuda::RowBlock&, DType, const float*,
                          int64_t, const float*, const Placement&) {
  throw no_cuda();
}
void add_tile_bias_gradient_device(float*, const int64_t (&)[4], const float*, int64_t, int64_t,
                                   int64_t, int64_t, const int64_t*, int64_t, const Placement&) {
  throw no_cuda();
}
void order_after_device(void*, const Placement&) { throw no_cuda(); }

#endif

}  // namespace dpa::cp
