// cuda_flash: capabilities and the forward orchestration (validated problem -> kernel params).
#include <cmath>
#include <string>

#include "core/attention_math.h"
#include "cuda/cuda_backends.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/fill_rows.h"
#include "cuda/flash/flash_forward_launch.h"
#include "cuda/flash/flash_tiles.h"
#include "cuda/runtime.h"
#include "cuda/sequence_tables.h"

namespace dpa {
namespace {

using cuda::FlashForwardParams;

constexpr double kLog2e = 1.4426950408889634;

void set_row_strides(const RowLayout& layout, int64_t& batch_stride, int64_t& row_stride,
                     int64_t& head_stride) {
  batch_stride = layout.stride_batch;
  row_stride = layout.stride_seq;
  head_stride = layout.stride_head;
}

class CudaFlashBackend final : public Backend {
 public:
  CudaFlashBackend() {
    caps_.kind = BackendKind::kCudaFlash;
    caps_.device = Device::kCUDA;
    const cuda::DeviceInfo& device = cuda::device_info(0);
    caps_.available = device.present && device.arch >= 80;
    caps_.unavailable_reason =
        device.present ? "needs sm_80 or newer" : "no CUDA device";
    caps_.min_arch = 80;
    caps_.dtypes = {DType::kFloat16, DType::kBFloat16};
    caps_.head_dims_qk = {64, 96, 128, 192, 256};
    caps_.head_dims_v = {64, 96, 128, 192, 256};
#if defined(DPA_MINIMAL_CUDA)
    caps_.head_dims_qk = caps_.head_dims_v = {128};
#endif
    caps_.extra_rules.push_back([](const FeatureRequest& r) -> std::optional<std::string> {
      if (cuda::flash_forward_has_head_dims(r.head_dim_qk, r.head_dim_v)) return std::nullopt;
      return "no kernel for the head dim pair " + std::to_string(r.head_dim_qk) + "/" +
             std::to_string(r.head_dim_v);
    });
    caps_.formats = {Format::kBSHD, Format::kSBHD, Format::kTHD};
    caps_.mask_types = {MaskType::kNoMask,        MaskType::kPadding,
                        MaskType::kCausal,        MaskType::kPaddingCausal,
                        MaskType::kCausalBottomRight, MaskType::kPaddingCausalBottomRight};
    caps_.window = true;
    caps_.padded_offsets = true;
    caps_.bias_types = {BiasType::kNoBias};
    caps_.alibi = true;
    caps_.softcap = true;
    caps_.softmax_types = {SoftmaxType::kVanilla, SoftmaxType::kOffByOne, SoftmaxType::kLearnable};
    caps_.dropout = true;
    caps_.deterministic = true;  // no atomics; split-KV merges in a fixed order
    caps_.backward = false;      // the fused backward is the next issue
  }

  const Capabilities& capabilities() const override { return caps_; }

  void forward(const AttentionProblem& p) const override {
    auto stream = static_cast<cudaStream_t>(p.stream);
    DPA_CUDA_CHECK(cudaSetDevice(p.device_index));
    cuda::SequenceTables tables = cuda::upload_sequence_tables(p, stream);

    FlashForwardParams params;
    params.q = p.q.data;
    params.k = p.k.data;
    params.v = p.v.data;
    params.o = p.o.data;
    params.lse = static_cast<float*>(p.lse.data);
    set_row_strides(p.q_rows, params.q_batch_stride, params.q_row_stride, params.q_head_stride);
    set_row_strides(p.k_rows, params.k_batch_stride, params.k_row_stride, params.k_head_stride);
    set_row_strides(p.v_rows, params.v_batch_stride, params.v_row_stride, params.v_head_stride);
    set_row_strides(p.o_rows, params.o_batch_stride, params.o_row_stride, params.o_head_stride);
    const bool thd = p.format == Format::kTHD;
    params.lse_batch_stride = thd ? 0 : p.heads_q * p.max_seqlen_q;
    params.lse_head_stride = thd ? p.total_q : p.max_seqlen_q;
    params.seqlen_q = tables.seqlen_q;
    params.seqlen_kv = tables.seqlen_kv;
    params.start_q = thd ? tables.start_q : nullptr;
    params.start_kv = thd ? tables.start_kv : nullptr;
    params.batch = int(p.batch);
    params.heads_q = int(p.heads_q);
    params.heads_kv = int(p.heads_kv);
    params.group_size = int(p.group_size());
    params.max_seqlen_q = int(p.max_seqlen_q);
    params.max_seqlen_kv = int(p.max_seqlen_kv);
    params.scale_log2 = float(p.scale * kLog2e);
    params.use_softcap = p.softcap > 0;
    if (params.use_softcap) {
      params.softcap_arg_scale = float(p.scale / p.softcap);
      params.softcap_log2 = float(p.softcap * kLog2e);
    }
    params.window_left = int(p.window_left);
    params.window_right = int(p.window_right);
    params.bottom_right = p.bottom_right;
    if (p.has_alibi) {
      params.alibi_slopes = static_cast<const float*>(p.alibi_slopes.data);
      params.alibi_batch_stride = int(p.alibi_stride_batch);
    }
    params.softmax_type = int(p.softmax_type);
    params.softmax_offset = static_cast<const float*>(p.softmax_offset.data);
    params.dropout_threshold = p.dropout_threshold;
    params.dropout_scale = float(1.0 / p.keep_prob);
    params.seed = p.rng.seed;
    params.offset = p.rng.offset;

    // Rows outside every sequence (bshd padding, thd gaps) get o = 0 and the empty-row LSE;
    // the kernel then overwrites every real row.
    if (cuda::has_rows_outside_sequences(p)) cuda::fill_empty_forward_rows(p, stream);

    const cuda::FlashTileShape shape =
        cuda::flash_forward_tile_shape(int(p.head_dim_qk), int(p.head_dim_v));
    const int64_t query_blocks = (p.max_seqlen_q + shape.block_m - 1) / shape.block_m;
    const int64_t kv_blocks = (p.max_seqlen_kv + shape.block_n - 1) / shape.block_n;
    params.num_splits = cuda::choose_num_splits(p.batch, p.heads_q, query_blocks, kv_blocks,
                                                cuda::device_info(p.device_index).sm_count);
    cuda::DeviceBuffer partials;
    if (params.num_splits > 1) {
      params.blocks_per_split = int((kv_blocks + params.num_splits - 1) / params.num_splits);
      const int64_t rows = int64_t(params.num_splits) * p.batch * p.heads_q * p.max_seqlen_q;
      partials = cuda::DeviceBuffer(size_t(rows) * size_t(p.head_dim_v + 1) * sizeof(float), stream);
      params.partial_lse = partials.get<float>();
      params.partial_o = params.partial_lse + rows;
    }
    cuda::launch_flash_forward(params, p.dtype, int(p.head_dim_qk), int(p.head_dim_v), stream);
  }

  void backward(const AttentionProblem&) const override {
    throw Error(ErrorCode::kInternal, "", "cuda_flash has no backward (the selector must not pick it)");
  }

 private:
  Capabilities caps_;
};

}  // namespace

const Backend& cuda_flash_backend() {
  static const CudaFlashBackend backend;
  return backend;
}

}  // namespace dpa
