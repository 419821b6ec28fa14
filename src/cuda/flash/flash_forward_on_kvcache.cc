#include "cuda/flash/flash_forward_on_kvcache.h"

#include <vector>

#include "core/kvcache_plan.h"
#include "core/kvcache_splits.h"
#include "core/workspace.h"
#include "cuda/device_buffer.h"
#include "cuda/flash/flash_tiles.h"
#include "cuda/kvcache/kvcache_device.h"
#include "cuda/kvcache/kvcache_launch.h"
#include "cuda/runtime.h"
#include "dpa/kvcache.h"

namespace dpa::cuda {
namespace {

// A [batch, rows, heads, dim] view of a bshd or sbhd tensor (the KV-cache kernel's order),
// whichever order its dimensions are stored in.
TensorView batch_major(const TensorView& tensor, const RowLayout& rows, int64_t batch,
                       int64_t row_count, int64_t heads, int64_t dim) {
  TensorView view = tensor;
  view.ndim = 4;
  view.shape = {batch, row_count, heads, dim};
  view.strides = {rows.stride_batch, rows.stride_seq, rows.stride_head, 1};
  return view;
}

// The problem as a KV-cache call: k and v are a contiguous cache of max_seqlen_kv rows per
// sequence, `cache_seqlens` (device int32 [b]) holds each sequence's keys, nothing is appended.
struct KvCacheCall {
  KvCachePlan plan;
  KvCacheConfig config;
  KvCacheArgs args;
};

KvCacheCall kvcache_call(const AttentionProblem& p, const int* cache_seqlens) {
  KvCacheCall call;
  KvCachePlan& plan = call.plan;
  plan.batch = p.batch;
  plan.heads_q = p.heads_q;
  plan.heads_kv = p.heads_kv;
  plan.head_dim_qk = p.head_dim_qk;
  plan.head_dim_v = p.head_dim_v;
  plan.device = Device::kCUDA;
  plan.device_index = p.device_index;
  plan.capacity = p.max_seqlen_kv;

  KvCacheConfig& config = call.config;
  config.causal = mask_is_causal(p.mask_type);
  config.window_left = p.window_left;
  config.window_right = p.window_right;
  config.softcap = p.softcap;
  config.scale = p.scale;
  config.softmax_type = p.softmax_type;

  KvCacheArgs& a = call.args;
  a.q = batch_major(p.q, p.q_rows, p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_qk);
  a.k_cache = batch_major(p.k, p.k_rows, p.batch, p.max_seqlen_kv, p.heads_kv, p.head_dim_qk);
  a.v_cache = batch_major(p.v, p.v_rows, p.batch, p.max_seqlen_kv, p.heads_kv, p.head_dim_v);
  a.o = batch_major(p.o, p.o_rows, p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_v);
  a.lse = p.lse;  // contiguous [b, H, sq], as the KV-cache call's
  a.cache_seqlens = TensorView::contiguous(const_cast<int*>(cache_seqlens), DType::kInt32,
                                           {p.batch}, Device::kCUDA);
  a.cache_seqlens.device_index = p.device_index;
  if (p.has_alibi) {  // [H] or [b, H], as the KV-cache call reads its batch stride from ndim
    a.alibi_slopes = p.alibi_slopes;
    a.alibi_slopes.ndim = p.alibi_stride_batch > 0 ? 2 : 1;
  }
  a.softmax_offset = p.softmax_offset;
  a.stream = p.stream;
  return call;
}

}  // namespace

bool forward_runs_on_kvcache_kernel(const FeatureRequest& r, size_t shared_memory_per_block) {
  if (r.pass != Pass::kForward || r.device != Device::kCUDA) return false;
  if (r.flash_forward_kernel != FlashForwardKernel::kAuto) return false;
  if (r.max_seqlen_q > kFlashDecodeMaxQueries) return false;
  // A contiguous cache: each sequence's keys start at row 0 of its batch (thd packs them), and
  // its queries fill q's rows (padding or cu_seqlens may shorten the keys, not the queries).
  if (r.format == Format::kTHD || !r.queries_fill_rows) return false;
  if (r.dropout || r.bias_type != BiasType::kNoBias || r.cp.tile) return false;
  if (r.dtype != DType::kFloat16 && r.dtype != DType::kBFloat16) return false;
  if (r.head_dim_qk != r.head_dim_v || !kvcache_device_head_dim(r.head_dim_qk)) return false;
  if (!r.rows_16_byte_aligned) return false;
  // The kernel places query i of sequence b at key i + skv_b - sq_b; a top-left diagonal is the
  // same one only when every sequence has as many keys as queries, and matters only to a causal
  // mask, a window and ALiBi.
  const bool uses_diagonal = mask_is_causal(r.mask_type) || r.window || r.alibi;
  const bool same_diagonal = r.keys_fill_rows && r.max_seqlen_q == r.max_seqlen_kv;
  if (uses_diagonal && !r.bottom_right && !same_diagonal) return false;
  const int head_dim = int(r.head_dim_qk);
  return size_t(kvcache_shared_bytes(head_dim, kvcache_default_stages(head_dim))) <=
         shared_memory_per_block;
}

bool forward_runs_on_kvcache_kernel(const FeatureRequest& r) {
  const DeviceInfo& device = device_info(r.device_index);
  return device.present && forward_runs_on_kvcache_kernel(r, device.shared_memory_per_block_optin);
}

void run_forward_on_kvcache_kernel(const AttentionProblem& p, cudaStream_t stream) {
  // Each sequence's keys (max_seqlen_kv unless padding or cu_seqlens shorten them).
  const DeviceBuffer cache_seqlens =
      upload(std::vector<int>(p.seqlen_kv.begin(), p.seqlen_kv.end()), stream);
  const KvCacheCall call = kvcache_call(p, cache_seqlens.get<int>());
  run_kvcache_on_device(call.plan, call.config, call.args);
}

size_t forward_on_kvcache_workspace_bytes(const AttentionProblem& p) {
  const KvCacheCall call = kvcache_call(p, nullptr);
  return workspace_bytes_for(
      {size_t(p.batch) * sizeof(int), kvcache_workspace_bytes(call.plan, call.config, call.args)});
}

}  // namespace dpa::cuda
