#include "cuda/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <mutex>

namespace dpa::cuda {
namespace {

constexpr int64_t kBoxColumns = 64;  // 128 bytes of 2-byte elements: one swizzle row

// The driver's encoder, found through the runtime so that dpa needs no link to libcuda.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static std::once_flag once;
  static PFN_cuTensorMapEncodeTiled_v12000 encoder = nullptr;
  std::call_once(once, [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                         cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      encoder = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
    else
      cudaGetLastError();
  });
  return encoder;
}

bool multiple_of_16_bytes(int64_t elements) { return elements >= 0 && (elements * 2) % 16 == 0; }

}  // namespace

bool tensor_map_can_address(const RowTensor& t) {
  const bool sizes = t.batch > 0 && t.rows > 0 && t.heads > 0 && t.dim > 0 &&
                     t.dim % kBoxColumns == 0 && t.rows < (int64_t(1) << 31) &&
                     t.batch < (int64_t(1) << 31) && t.heads < (int64_t(1) << 31);
  // Strides are below 2^40 bytes for the encoder; a stride of 0 (a broadcast) is not a layout
  // TMA takes for dims above the first.
  auto stride_ok = [](int64_t s) {
    return s > 0 && multiple_of_16_bytes(s) && s < (int64_t(1) << 39);
  };
  return sizes && reinterpret_cast<uintptr_t>(t.base) % 16 == 0 && stride_ok(t.row_stride) &&
         stride_ok(t.head_stride) && stride_ok(t.batch_stride) &&
         (t.dtype == DType::kBFloat16 || t.dtype == DType::kFloat16);
}

std::optional<CUtensorMap> encode_row_tensor_map(const RowTensor& t, int box_rows, int box_heads) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return std::nullopt;
  // Dimensions innermost first: columns, rows, heads, batch; strides of dims 1..3 in bytes.
  const cuuint64_t dims[4] = {cuuint64_t(t.dim), cuuint64_t(t.rows), cuuint64_t(t.heads),
                              cuuint64_t(t.batch)};
  const cuuint64_t strides[3] = {cuuint64_t(t.row_stride * 2), cuuint64_t(t.head_stride * 2),
                                 cuuint64_t(t.batch_stride * 2)};
  const cuuint32_t box[4] = {cuuint32_t(kBoxColumns), cuuint32_t(box_rows), cuuint32_t(box_heads),
                             1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult result =
      encode(&map,
             t.dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                         : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
             4, const_cast<void*>(t.base), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) return std::nullopt;
  return map;
}

}  // namespace dpa::cuda
