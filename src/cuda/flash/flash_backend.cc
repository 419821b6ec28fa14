// cuda_flash: capabilities and the forward orchestration (validated problem -> kernel params);
// the backward's is flash_backward.cc.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "core/workspace.h"
#include "cuda/cuda_backends.h"
#include "cuda/cuda_check.h"
#include "cuda/fill_rows.h"
#include "cuda/flash/flash_backward_launch.h"
#include "cuda/flash/flash_forward_launch.h"
#include "cuda/flash/flash_forward_on_kvcache.h"
#include "cuda/flash/flash_forward_plan.h"
#include "cuda/flash/flash_head_dim_pairs.h"
#include "cuda/flash/flash_tiles.h"
#include "cuda/runtime.h"

namespace dpa {
namespace {

void add_once(std::vector<int64_t>& values, int64_t value) {
  if (std::find(values.begin(), values.end(), value) == values.end()) values.push_back(value);
}

// The query heads per KV head the forward's tile may pack (flash_forward_packable_group).
int64_t packable_group(const FeatureRequest& r) {
  return cuda::flash_forward_packable_group(r.heads_q, r.heads_kv, r.format == Format::kTHD,
                                            r.keys_fill_rows);
}

// The backward a request would run (the launch takes the same plan: flash_backward.cc).
cuda::FlashBackwardPlan backward_plan(const FeatureRequest& r) {
  return cuda::flash_backward_plan(r.device_arch, int(r.head_dim_qk), int(r.head_dim_v), r.dropout,
                                   cuda::requested_backward_family(r.flash_backward_kernel),
                                   r.window_span);
}

// The kernel family and tiles a request would run on, from the same functions the launch uses
// (flash_forward_shape, flash_backward_plan), for explain().
std::string describe_flash_plan(const FeatureRequest& r) {
  const int dqk = int(r.head_dim_qk), dv = int(r.head_dim_v);
  if (r.pass == Pass::kBackward) {
    const cuda::FlashBackwardPlan plan = backward_plan(r);
    const std::string shared = ", " + std::to_string(plan.shared_bytes) + " bytes of shared memory";
    switch (plan.family) {
      case cuda::FlashBackwardFamily::kOneKernel:
        return std::string(
                   "backward kernel family one_kernel (one kernel per key block, fp32 dq "
                   "reductions") +
               (r.deterministic ? " in key-block order)" : ")") + ", " +
               std::to_string(plan.query_tile_rows) + "-row query tiles" + shared;
      default:
        return "backward kernel family mma_sync (atomic-free pair)" + shared;
    }
  }
  if (cuda::forward_runs_on_kvcache_kernel(r))
    return "forward kernel family kvcache decode (the query heads of a KV head packed into "
           "16-row blocks, split-KV with an LSE merge)";
  const cuda::FlashTileShape shape =
      cuda::flash_forward_shape(dqk, dv, r.max_seqlen_q, r.window_span, r.device_arch,
                                r.flash_forward_kernel, r.dropout, packable_group(r));
  const std::string tiles =
      ", tiles " + std::to_string(shape.block_m) + " x " + std::to_string(shape.block_n);
  if (shape.warp_specialized) {
    const bool fixed_max = cuda::softcap_fixed_max_applies(r.softcap_value, r.dtype, r.alibi);
    std::string form;
    switch (cuda::flash_forward_logit_form(dqk, dv, r.softcap, fixed_max, r.alibi, r.dropout)) {
      case cuda::FlashLogitForm::kPlain:
        form = ", plain-logits kernel";
        break;
      case cuda::FlashLogitForm::kSoftcapFixedMax:
        form = ", fixed-max softcap kernel";
        break;
      case cuda::FlashLogitForm::kGeneral:
        break;
    }
    if (shape.packed_heads > 1)
      form += ", " + std::to_string(shape.packed_heads) +
              " query heads per block (GQA packing, where it takes one split)";
    // The request says whether both bounds are finite (window_span) or neither is, not which
    // one is when one is: a one-sided window counts here as bounded on the right.
    const bool left_bounded = r.window_span >= 0;
    const bool right_bounded = left_bounded || r.window || mask_is_causal(r.mask_type);
    const std::string grid = cuda::flash_forward_blocks_alike(left_bounded, right_bounded)
                                 ? ", a persistent grid by static stride"
                                 : ", a persistent grid under a dynamic scheduler";
    return "forward kernel family wgmma warp-specialised (TMA copies where every sequence fills "
           "its tensor, else cp.async)" +
           tiles + form + grid + " (where TMA copies every tile and it takes one split)";
  }
  if (shape.warps == 1) return "forward kernel family mma_sync decode (split-KV)" + tiles;
  return "forward kernel family mma_sync" + tiles;
}

class CudaFlashBackend final : public Backend {
 public:
  CudaFlashBackend() {
    caps_.kind = BackendKind::kCudaFlash;
    caps_.device = Device::kCUDA;
    const cuda::DeviceInfo& device = cuda::device_info(0);
    caps_.available = device.present && device.arch >= 80;
    caps_.unavailable_reason = device.present ? "needs sm_80 or newer" : "no CUDA device";
    caps_.min_arch = 80;
    caps_.dtypes = {DType::kFloat16, DType::kBFloat16};
    // Every head dim of some compiled pair; the rule below checks the pair itself.
    for (const cuda::FlashHeadDimPair& pair : cuda::kFlashHeadDimPairs) {
      add_once(caps_.head_dims_qk, pair.qk);
      add_once(caps_.head_dims_v, pair.v);
    }
    caps_.extra_rules.push_back([](const FeatureRequest& r) -> std::optional<std::string> {
      if (cuda::flash_forward_has_head_dims(r.head_dim_qk, r.head_dim_v)) return std::nullopt;
      return "no kernel for the head dim pair " + std::to_string(r.head_dim_qk) + "/" +
             std::to_string(r.head_dim_v);
    });
    caps_.formats = {Format::kBSHD, Format::kSBHD, Format::kTHD};
    caps_.mask_types = {MaskType::kNoMask,
                        MaskType::kPadding,
                        MaskType::kCausal,
                        MaskType::kPaddingCausal,
                        MaskType::kCausalBottomRight,
                        MaskType::kPaddingCausalBottomRight};
    caps_.window = true;
    caps_.padded_offsets = true;
    caps_.bias_types = {BiasType::kNoBias};
    caps_.alibi = true;
    caps_.softcap = true;
    caps_.softmax_types = {SoftmaxType::kVanilla, SoftmaxType::kOffByOne, SoftmaxType::kLearnable};
    caps_.dropout = true;
    // No atomics anywhere: split-KV merges in a fixed order, the backward's kernels own the rows
    // they write and sum GQA groups and the sink gradient in a fixed order.
    caps_.deterministic = true;
    // Context-parallel tiles: global diagonal, dropout coordinates and sink-free partials
    // (flash_tile_math.cuh). Dropout draws whole 8-key Philox blocks per 8 local keys, so a
    // tile whose keys do not start on a multiple of 8 goes elsewhere.
    caps_.cp_tiles = true;
    caps_.extra_rules.push_back([](const FeatureRequest& r) -> std::optional<std::string> {
      if (r.cp.tile && r.dropout && r.cp.keys_unaligned)
        return "dropout in a context-parallel tile whose keys do not start on a multiple of 8";
      return std::nullopt;
    });
    // Rows are copied in 16-byte chunks (cp.async) and stored in 4-byte pairs.
    caps_.extra_rules.push_back([](const FeatureRequest& r) -> std::optional<std::string> {
      if (r.rows_16_byte_aligned) return std::nullopt;
      return "a tensor's rows do not start on 16-byte boundaries (base pointer or stride)";
    });
    // Tiles must fit the device's shared memory per block (sm_86 / sm_89 have 99 KB against
    // sm_80's 163 KB and sm_90's 227 KB).
    caps_.extra_rules.push_back([](const FeatureRequest& r) -> std::optional<std::string> {
      const cuda::DeviceInfo& device = cuda::device_info(r.device_index);
      if (!device.present) return std::nullopt;  // unavailable anyway, with its own reason
      const int dqk = int(r.head_dim_qk), dv = int(r.head_dim_v);
      const int need =
          r.pass == Pass::kBackward
              ? backward_plan(r).shared_bytes
              : cuda::flash_forward_shape(dqk, dv, r.max_seqlen_q, r.window_span, device.arch,
                                          r.flash_forward_kernel, r.dropout, packable_group(r))
                    .shared_bytes;
      if (size_t(need) <= device.shared_memory_per_block_optin) return std::nullopt;
      return "its tiles need " + std::to_string(need) + " bytes of shared memory per block, the " +
             "device has " + std::to_string(device.shared_memory_per_block_optin);
    });
    caps_.backward = true;
    caps_.sink_grad = true;
    caps_.describe_plan = describe_flash_plan;
  }

  const Capabilities& capabilities() const override { return caps_; }

  void forward(const AttentionProblem& p) const override {
    auto stream = static_cast<cudaStream_t>(p.stream);
    const cuda::DeviceGuard device(p.device_index);  // restores the caller's device
    if (cuda::forward_runs_on_kvcache_kernel(make_feature_request(p)))
      return cuda::run_forward_on_kvcache_kernel(p, stream);
    const cuda::FlashTileShape shape = cuda::flash_forward_shape_for(p);
    cuda::FlashForwardPlan plan = cuda::plan_flash_forward(p, shape, stream);
    // Rows outside every sequence (bshd padding, thd gaps) get o = 0 and the empty-row LSE;
    // the kernel then overwrites every real row.
    if (cuda::has_rows_outside_sequences(p)) cuda::fill_empty_forward_rows(p, stream);
    cuda::launch_flash_forward(plan.params, p.dtype, int(p.head_dim_qk), int(p.head_dim_v), stream);
  }

  void backward(const AttentionProblem& p) const override {
    const cuda::DeviceGuard device(p.device_index);  // restores the caller's device
    cuda::run_flash_backward(p, static_cast<cudaStream_t>(p.stream));
  }

  size_t workspace_bytes(const AttentionProblem& p) const override {
    if (p.pass == Pass::kBackward) return cuda::flash_backward_workspace_bytes(p);
    if (cuda::forward_runs_on_kvcache_kernel(make_feature_request(p)))
      return cuda::forward_on_kvcache_workspace_bytes(p);
    const cuda::FlashTileShape shape = cuda::flash_forward_shape_for(p);
    const int splits = cuda::flash_forward_num_splits(p, shape);
    return workspace_bytes_for({cuda::sequence_tables_bytes(p),
                                cuda::flash_forward_partials_bytes(p, splits),
                                cuda::flash_forward_tile_counter_bytes(shape, splits)});
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
