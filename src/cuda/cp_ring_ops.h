// Device-side pieces of the device-resident p2p ring of context parallelism (cp/device_ring.h):
// the fp32 LSE merge of partial outputs, gradient accumulation, the sink's final step and its
// gradient, and stream ordering; the device-resident general algorithms use them too (element
// dtypes fp16, bf16 or fp32). No CUDA headers here: streams are cudaStream_t passed as
// void* (nullptr: the legacy default stream). Every function enqueues and returns.
#pragma once

#include <cstdint>

#include "dpa/types.h"

namespace dpa::cuda {

// A [batch, rows, width] block of a bshd or sbhd tensor (or of an accumulator in the same
// order) whose heads and head-dim elements are contiguous: width = heads * dim. Strides in
// elements. A block `first_row` rows into a tensor is the tensor with `data` moved there.
struct RowBlock {
  void* data = nullptr;
  int64_t batch = 0, rows = 0, width = 0;
  int64_t batch_stride = 0, row_stride = 0;
};

// acc (fp32) += tile (dtype), element by element; acc and tile have the same batch, rows and
// width.
void accumulate_rows(const RowBlock& acc, const RowBlock& tile, DType tile_dtype, void* stream);

// dst (dtype: fp16, bf16, fp32 or fp64) = src (fp32).
void convert_rows(const RowBlock& dst, DType dst_dtype, const RowBlock& src, void* stream);

// Merges a partial (o_tile in `tile_dtype`, lse_tile fp32 [batch, heads, rows] contiguous) into
// the fp32 accumulators o_acc (same batch and rows) and lse_acc ([batch, heads, lse_rows] with
// the block's rows from `lse_first_row`): LSE = logaddexp(LSE_acc, LSE_tile),
// o = o_acc exp(LSE_acc - LSE) + o_tile exp(LSE_tile - LSE). A row whose accumulator LSE is -inf
// takes the tile as it is (o_acc may hold anything there).
void merge_partial_rows(const RowBlock& o_acc, float* lse_acc, int64_t lse_rows,
                        int64_t lse_first_row, const RowBlock& o_tile, DType tile_dtype,
                        const float* lse_tile, int64_t heads, void* stream);

// The sink joins once per row (DESIGN.md §8): LSE' = logaddexp(LSE_acc, sigma_h),
// o = o_acc exp(LSE_acc - LSE'), written to o (dtype) and lse ([batch, heads, rows]).
// softmax_type as in sink_logit (0 vanilla, 1 off-by-one, 2 learnable with offsets [heads]).
void finalize_forward_rows(const RowBlock& o, DType dtype, float* lse, const RowBlock& o_acc,
                           const float* lse_acc, int64_t heads, int softmax_type,
                           const float* offsets, void* stream);

// dalpha_h = -sum over this block's rows of exp(sigma_h - LSE) * sum_c dO * O, written (not
// added) to dalpha [heads]; o and d_o in `dtype`, lse [batch, heads, rows]. A fixed reduction
// order: the same inputs give the same bits.
void sink_gradient(float* dalpha, const RowBlock& o, const RowBlock& d_o, DType dtype,
                   const float* lse, int64_t heads, const float* offsets, void* stream);

// Adds a tile-local fp32 bias gradient `tile` [batch, heads, rows, cols] (contiguous) into an
// unsharded fp32 accumulator at the tile's global positions: element (b, h, i, j) goes to
// out[b * strides[0] + (h + head_offset) * strides[1] + (i + q_position_b) * strides[2] +
// (j + kv_position_b) * strides[3]] for i < valid_q_b and j < valid_kv_b (a broadcast dim has
// stride 0 there). `sequences` (device memory) holds per b: valid_q, valid_kv, q_position,
// kv_position. One thread per (h, i, j) takes the sequences in order; with a batch-broadcast
// accumulator (strides[0] == 0) each sequence is its own launch, in order, so that sums never
// race and come in a fixed order.
void add_tile_bias_gradient(float* out, const int64_t (&strides)[4], const float* tile,
                            int64_t batch, int64_t heads, int64_t rows, int64_t cols,
                            const int64_t* sequences, int64_t head_offset, void* stream);

// dst[i * dst_strides[0] + j * dst_strides[1]] = src[i * src_strides[0] + j * src_strides[1]]
// for i < extent0, j < extent1 (fp32, strides in elements): the LSE's transposes between a
// chunk set's [rows, H] and the tensors' [.., H, rows].
void copy_strided_f32(float* dst, const int64_t (&dst_strides)[2], const float* src,
                      const int64_t (&src_strides)[2], int64_t extent0, int64_t extent1,
                      void* stream);

// dst [planes, rows] = src [planes, src_rows] columns [first_row, first_row + rows) (fp32).
void copy_lse_rows(float* dst, const float* src, int64_t planes, int64_t src_rows,
                   int64_t first_row, int64_t rows, void* stream);

// n fp32 values set to `value`.
void fill_f32(float* data, float value, int64_t n, void* stream);

// out[i] = the sum over the `inputs` arrays of their element i (n elements each, `dtype` fp32 or
// fp64, `inputs` of them spaced `input_stride` elements apart from `first`): the in-process
// device communicators' reductions. out may not overlap the inputs.
void sum_arrays(void* out, const void* first, int inputs, int64_t input_stride, int64_t n,
                DType dtype, void* stream);

// Work enqueued on `waiting` from now on runs after everything enqueued on `stream` so far.
void order_after(void* waiting, void* stream);

}  // namespace dpa::cuda
