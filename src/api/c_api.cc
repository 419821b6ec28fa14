// The C ABI over DotProductAttention: translate structs, catch every exception (the KV-cache
// call's functions: c_api_kvcache.cc).
#include "dpa/c_api.h"

#include <memory>
#include <string>

#include "api/c_api_support.h"
#include "dpa/attention.h"

struct dpa_attention_s {
  std::unique_ptr<dpa::DotProductAttention> attention;
};

// The C enums are the C++ ones by value (dpa/c_api.h says so): checked here, where both are seen.
static_assert(DPA_FLOAT16 == int(dpa::DType::kFloat16) &&
              DPA_BFLOAT16 == int(dpa::DType::kBFloat16) &&
              DPA_FLOAT32 == int(dpa::DType::kFloat32) &&
              DPA_FLOAT64 == int(dpa::DType::kFloat64) && DPA_INT32 == int(dpa::DType::kInt32) &&
              DPA_BOOL == int(dpa::DType::kBool));
static_assert(DPA_DEVICE_CPU == int(dpa::Device::kCPU) &&
              DPA_DEVICE_CUDA == int(dpa::Device::kCUDA));
static_assert(DPA_BSHD == int(dpa::Format::kBSHD) && DPA_SBHD == int(dpa::Format::kSBHD) &&
              DPA_THD == int(dpa::Format::kTHD));
static_assert(DPA_MASK_NO_MASK == int(dpa::MaskType::kNoMask) &&
              DPA_MASK_PADDING == int(dpa::MaskType::kPadding) &&
              DPA_MASK_CAUSAL == int(dpa::MaskType::kCausal) &&
              DPA_MASK_PADDING_CAUSAL == int(dpa::MaskType::kPaddingCausal) &&
              DPA_MASK_CAUSAL_BOTTOM_RIGHT == int(dpa::MaskType::kCausalBottomRight) &&
              DPA_MASK_PADDING_CAUSAL_BOTTOM_RIGHT ==
                  int(dpa::MaskType::kPaddingCausalBottomRight) &&
              DPA_MASK_ARBITRARY == int(dpa::MaskType::kArbitrary));
static_assert(DPA_SOFTMAX_VANILLA == int(dpa::SoftmaxType::kVanilla) &&
              DPA_SOFTMAX_OFF_BY_ONE == int(dpa::SoftmaxType::kOffByOne) &&
              DPA_SOFTMAX_LEARNABLE == int(dpa::SoftmaxType::kLearnable));
static_assert(DPA_BIAS_NONE == int(dpa::BiasType::kNoBias) &&
              DPA_BIAS_PRE_SCALE == int(dpa::BiasType::kPreScale) &&
              DPA_BIAS_POST_SCALE == int(dpa::BiasType::kPostScale));
static_assert(DPA_BACKEND_AUTO == int(dpa::BackendKind::kAuto) &&
              DPA_BACKEND_CPU_EXACT == int(dpa::BackendKind::kCpuExact) &&
              DPA_BACKEND_CPU == int(dpa::BackendKind::kCpu) &&
              DPA_BACKEND_CUDA_UNFUSED == int(dpa::BackendKind::kCudaUnfused) &&
              DPA_BACKEND_CUDA_FLASH == int(dpa::BackendKind::kCudaFlash));

namespace {

using dpa::c_api::apply_call;
using dpa::c_api::guarded;
using dpa::c_api::to_view;

dpa::AttentionInputs to_inputs(const dpa_inputs_t* in) {
  dpa::require(in != nullptr, "inputs", "must not be NULL");
  dpa::AttentionInputs out;
  out.q = to_view(in->q, "q");
  out.k = to_view(in->k, "k");
  out.v = to_view(in->v, "v");
  out.cu_seqlens_q = to_view(in->cu_seqlens_q, "cu_seqlens_q");
  out.cu_seqlens_kv = to_view(in->cu_seqlens_kv, "cu_seqlens_kv");
  out.cu_seqlens_q_padded = to_view(in->cu_seqlens_q_padded, "cu_seqlens_q_padded");
  out.cu_seqlens_kv_padded = to_view(in->cu_seqlens_kv_padded, "cu_seqlens_kv_padded");
  out.bias = to_view(in->bias, "bias");
  out.alibi_slopes = to_view(in->alibi_slopes, "alibi_slopes");
  out.softmax_offset = to_view(in->softmax_offset, "softmax_offset");
  out.attn_mask = to_view(in->attn_mask, "attn_mask");
  return out;
}

dpa::AttentionConfig to_config(const dpa_config_t* c) {
  dpa::require(c != nullptr, "config", "must not be NULL");
  dpa::require(c->size == sizeof(dpa_config_t) && c->version == DPA_CONFIG_VERSION, "config",
               "was not initialised with DPA_CONFIG_INITIALIZER of this dpa version");
  dpa::require(c->backend >= -1 && c->backend <= 3, "backend", "is not a known backend");
  dpa::AttentionConfig config;
  config.format = static_cast<dpa::Format>(c->format);
  config.mask_type = static_cast<dpa::MaskType>(c->mask_type);
  config.window_left = c->window_left;
  config.window_right = c->window_right;
  config.bottom_right_diagonal = c->bottom_right_diagonal != 0;
  config.softcap = c->softcap;
  if (c->scale != 0.0) config.scale = c->scale;
  config.softmax_type = static_cast<dpa::SoftmaxType>(c->softmax_type);
  config.bias_type = static_cast<dpa::BiasType>(c->bias_type);
  config.dropout = c->dropout;
  config.seed = c->seed;
  config.layer_number = c->layer_number;
  config.deterministic = c->deterministic != 0;
  config.backend = static_cast<dpa::BackendKind>(c->backend);
  return config;
}

dpa::DotProductAttention& unwrap(dpa_attention_t attention) {
  dpa::require(attention != nullptr && attention->attention != nullptr, "attention",
               "is not a handle from dpa_attention_create");
  return *attention->attention;
}

dpa::ForwardArgs forward_args(const dpa_inputs_t* inputs, dpa_tensor_t o, dpa_tensor_t lse,
                              const dpa_rng_state_t* rng) {
  dpa::ForwardArgs args;
  args.in = to_inputs(inputs);
  args.o = to_view(o, "o");
  args.lse = to_view(lse, "lse");
  if (rng) args.rng = dpa::RngState{rng->seed, rng->offset};
  return args;
}

dpa::BackwardArgs backward_args(const dpa_inputs_t* inputs, dpa_tensor_t o, dpa_tensor_t lse,
                                dpa_tensor_t d_o, dpa_tensor_t dq, dpa_tensor_t dk, dpa_tensor_t dv,
                                dpa_tensor_t dbias, dpa_tensor_t dsoftmax_offset,
                                const dpa_rng_state_t* rng) {
  dpa::BackwardArgs args;
  args.in = to_inputs(inputs);
  args.o = to_view(o, "o");
  args.lse = to_view(lse, "lse");
  args.d_o = to_view(d_o, "d_o");
  args.dq = to_view(dq, "dq");
  args.dk = to_view(dk, "dk");
  args.dv = to_view(dv, "dv");
  args.dbias = to_view(dbias, "dbias");
  args.dsoftmax_offset = to_view(dsoftmax_offset, "dsoftmax_offset");
  if (rng) args.rng = dpa::RngState{rng->seed, rng->offset};
  return args;
}

}  // namespace

extern "C" {

dpa_tensor_t dpa_tensor_contiguous(void* data, dpa_dtype_t dtype, int32_t ndim,
                                   const int64_t* shape) {
  dpa_tensor_t t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim < 0 ? 0 : (ndim > 5 ? 5 : ndim);
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.strides[d] = stride;
    stride *= shape[d];
  }
  return t;
}

dpa_status_t dpa_attention_create(const dpa_config_t* config, dpa_attention_t* out) {
  return guarded([&] {
    dpa::require(out != nullptr, "out", "must not be NULL");
    auto handle = std::make_unique<dpa_attention_s>();
    handle->attention = std::make_unique<dpa::DotProductAttention>(to_config(config));
    *out = handle.release();
  });
}

dpa_status_t dpa_attention_destroy(dpa_attention_t attention) {
  return guarded([&] { delete attention; });
}

dpa_status_t dpa_attention_forward(dpa_attention_t attention, const dpa_inputs_t* inputs,
                                   dpa_tensor_t o, dpa_tensor_t lse, const dpa_rng_state_t* rng,
                                   dpa_rng_state_t* rng_used) {
  return dpa_attention_forward_ex(attention, inputs, o, lse, rng, rng_used, nullptr);
}

dpa_status_t dpa_attention_forward_ex(dpa_attention_t attention, const dpa_inputs_t* inputs,
                                      dpa_tensor_t o, dpa_tensor_t lse, const dpa_rng_state_t* rng,
                                      dpa_rng_state_t* rng_used, const dpa_call_t* call) {
  return guarded([&] {
    dpa::ForwardArgs args = forward_args(inputs, o, lse, rng);
    apply_call(call, args.stream, args.workspace);
    dpa::ForwardResult result = unwrap(attention).forward(args);
    if (rng_used) *rng_used = dpa_rng_state_t{result.rng.seed, result.rng.offset};
  });
}

dpa_status_t dpa_attention_forward_workspace_size(dpa_attention_t attention,
                                                  const dpa_inputs_t* inputs, dpa_tensor_t o,
                                                  dpa_tensor_t lse, const dpa_rng_state_t* rng,
                                                  size_t* bytes) {
  return guarded([&] {
    dpa::require(bytes != nullptr, "bytes", "must not be NULL");
    *bytes = unwrap(attention).workspace_size(forward_args(inputs, o, lse, rng));
  });
}

dpa_status_t dpa_attention_backward(dpa_attention_t attention, const dpa_inputs_t* inputs,
                                    dpa_tensor_t o, dpa_tensor_t lse, dpa_tensor_t d_o,
                                    dpa_tensor_t dq, dpa_tensor_t dk, dpa_tensor_t dv,
                                    dpa_tensor_t dbias, dpa_tensor_t dsoftmax_offset,
                                    const dpa_rng_state_t* rng) {
  return dpa_attention_backward_ex(attention, inputs, o, lse, d_o, dq, dk, dv, dbias,
                                   dsoftmax_offset, rng, nullptr);
}

dpa_status_t dpa_attention_backward_ex(dpa_attention_t attention, const dpa_inputs_t* inputs,
                                       dpa_tensor_t o, dpa_tensor_t lse, dpa_tensor_t d_o,
                                       dpa_tensor_t dq, dpa_tensor_t dk, dpa_tensor_t dv,
                                       dpa_tensor_t dbias, dpa_tensor_t dsoftmax_offset,
                                       const dpa_rng_state_t* rng, const dpa_call_t* call) {
  return guarded([&] {
    dpa::BackwardArgs args =
        backward_args(inputs, o, lse, d_o, dq, dk, dv, dbias, dsoftmax_offset, rng);
    apply_call(call, args.stream, args.workspace);
    unwrap(attention).backward(args);
  });
}

dpa_status_t dpa_attention_backward_workspace_size(
    dpa_attention_t attention, const dpa_inputs_t* inputs, dpa_tensor_t o, dpa_tensor_t lse,
    dpa_tensor_t d_o, dpa_tensor_t dq, dpa_tensor_t dk, dpa_tensor_t dv, dpa_tensor_t dbias,
    dpa_tensor_t dsoftmax_offset, const dpa_rng_state_t* rng, size_t* bytes) {
  return guarded([&] {
    dpa::require(bytes != nullptr, "bytes", "must not be NULL");
    *bytes = unwrap(attention).workspace_size(
        backward_args(inputs, o, lse, d_o, dq, dk, dv, dbias, dsoftmax_offset, rng));
  });
}

const char* dpa_last_error(void) { return dpa::c_api::last_error().c_str(); }

const char* dpa_status_string(dpa_status_t status) {
  switch (status) {
    case DPA_SUCCESS:
      return "success";
    case DPA_INVALID_ARGUMENT:
      return "invalid argument";
    case DPA_NOT_SUPPORTED:
      return "not supported";
    case DPA_BACKEND_FAILURE:
      return "backend failure";
    case DPA_INTERNAL_ERROR:
      return "internal error";
    case DPA_IO_ERROR:
      return "i/o error";
  }
  return "unknown status";
}

}  // extern "C"
