/* dpa C ABI: opaque handles, one status enum, a thread-local last-error message.
 * Every function returns a status; on failure nothing has been written to the outputs and
 * dpa_last_error() describes the problem, naming the offending argument. */
#ifndef DPA_C_API_H_
#define DPA_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DPA_SUCCESS = 0,
  DPA_INVALID_ARGUMENT = 1,
  DPA_NOT_SUPPORTED = 2,
  DPA_BACKEND_FAILURE = 3,
  DPA_INTERNAL_ERROR = 4,
  DPA_IO_ERROR = 5,
} dpa_status_t;

/* Values match the C++ enums in dpa/types.h. */
typedef enum {
  DPA_FLOAT16 = 0,
  DPA_BFLOAT16 = 1,
  DPA_FLOAT32 = 2,
  DPA_FLOAT64 = 3,
  DPA_INT32 = 4,
  DPA_BOOL = 5
} dpa_dtype_t;
typedef enum { DPA_DEVICE_CPU = 0, DPA_DEVICE_CUDA = 1 } dpa_device_t;
typedef enum { DPA_BSHD = 0, DPA_SBHD = 1, DPA_THD = 2 } dpa_format_t;
typedef enum {
  DPA_MASK_NO_MASK = 0,
  DPA_MASK_PADDING = 1,
  DPA_MASK_CAUSAL = 2,
  DPA_MASK_PADDING_CAUSAL = 3,
  DPA_MASK_CAUSAL_BOTTOM_RIGHT = 4,
  DPA_MASK_PADDING_CAUSAL_BOTTOM_RIGHT = 5,
  DPA_MASK_ARBITRARY = 6
} dpa_mask_type_t;
typedef enum {
  DPA_SOFTMAX_VANILLA = 0,
  DPA_SOFTMAX_OFF_BY_ONE = 1,
  DPA_SOFTMAX_LEARNABLE = 2
} dpa_softmax_type_t;
typedef enum { DPA_BIAS_NONE = 0, DPA_BIAS_PRE_SCALE = 1, DPA_BIAS_POST_SCALE = 2 } dpa_bias_type_t;
typedef enum {
  DPA_BACKEND_AUTO = -1,
  DPA_BACKEND_CPU_EXACT = 0,
  DPA_BACKEND_CPU = 1,
  DPA_BACKEND_CUDA_UNFUSED = 2,
  DPA_BACKEND_CUDA_FLASH = 3
} dpa_backend_t;

/* A strided tensor view; strides in elements. An unused optional tensor has ndim 0. */
typedef struct {
  void* data;
  int32_t dtype;
  int32_t device;
  int32_t device_index;
  int32_t ndim;
  int64_t shape[5];
  int64_t strides[5];
} dpa_tensor_t;

#define DPA_CONFIG_VERSION 1

/* Versioned config: start from DPA_CONFIG_INITIALIZER and set fields by name. */
typedef struct {
  size_t size;      /* sizeof(dpa_config_t) */
  uint32_t version; /* DPA_CONFIG_VERSION */
  int32_t format;
  int32_t mask_type;
  int64_t window_left;  /* -1 unbounded */
  int64_t window_right; /* -1 unbounded */
  int32_t bottom_right_diagonal;
  double softcap; /* 0 disables */
  double scale;   /* 0 means 1/sqrt(dqk) */
  int32_t softmax_type;
  int32_t bias_type;
  double dropout;
  uint64_t seed;
  int32_t layer_number;
  int32_t deterministic;
  int32_t backend; /* dpa_backend_t */
} dpa_config_t;

/* Field by field: size, version, format, mask_type, window_left (-1), window_right (-1),
 * bottom_right_diagonal (1), softcap (0: off), scale (0: 1/sqrt(dqk)), softmax_type,
 * bias_type, dropout, seed, layer_number (0: off), deterministic (0), backend (auto). */
#define DPA_CONFIG_INITIALIZER                                                                 \
  {                                                                                            \
    sizeof(dpa_config_t), DPA_CONFIG_VERSION, DPA_BSHD, DPA_MASK_NO_MASK, -1, -1, 1, 0.0, 0.0, \
        DPA_SOFTMAX_VANILLA, DPA_BIAS_NONE, 0.0, 0, 0, 0, DPA_BACKEND_AUTO                     \
  }

typedef struct {
  dpa_tensor_t q, k, v;
  dpa_tensor_t cu_seqlens_q, cu_seqlens_kv;
  dpa_tensor_t cu_seqlens_q_padded, cu_seqlens_kv_padded;
  dpa_tensor_t bias, alibi_slopes, softmax_offset, attn_mask;
} dpa_inputs_t;

typedef struct {
  uint64_t seed;
  uint64_t offset;
} dpa_rng_state_t;

typedef struct dpa_attention_s* dpa_attention_t;

/* A contiguous view of `ndim` (<= 5) dims on the host. */
dpa_tensor_t dpa_tensor_contiguous(void* data, dpa_dtype_t dtype, int32_t ndim,
                                   const int64_t* shape);

dpa_status_t dpa_attention_create(const dpa_config_t* config, dpa_attention_t* out);
dpa_status_t dpa_attention_destroy(dpa_attention_t attention);

/* rng: NULL draws (config.seed, next offset); rng_used (nullable) receives the state to pass
 * to backward. */
dpa_status_t dpa_attention_forward(dpa_attention_t attention, const dpa_inputs_t* inputs,
                                   dpa_tensor_t o, dpa_tensor_t lse, const dpa_rng_state_t* rng,
                                   dpa_rng_state_t* rng_used);

/* dbias / dsoftmax_offset with ndim 0 are not computed. */
dpa_status_t dpa_attention_backward(dpa_attention_t attention, const dpa_inputs_t* inputs,
                                    dpa_tensor_t o, dpa_tensor_t lse, dpa_tensor_t d_o,
                                    dpa_tensor_t dq, dpa_tensor_t dk, dpa_tensor_t dv,
                                    dpa_tensor_t dbias, dpa_tensor_t dsoftmax_offset,
                                    const dpa_rng_state_t* rng);

/* The CUDA stream and the device workspace of one call, for device tensors. Start from
 * DPA_CALL_INITIALIZER. stream: a cudaStream_t (NULL: the default stream). workspace: device
 * memory of workspace_bytes >= the size query's answer, starting on a 256-byte boundary (as
 * cudaMalloc's blocks do), valid until the call's work on the stream has run; NULL with 0 bytes
 * lets the library take stream-ordered memory from the CUDA driver's pool. */
typedef struct {
  size_t size; /* sizeof(dpa_call_t) */
  void* stream;
  void* workspace;
  size_t workspace_bytes;
} dpa_call_t;

#define DPA_CALL_INITIALIZER \
  { sizeof(dpa_call_t), NULL, NULL, 0 }

/* As dpa_attention_forward / _backward, on call->stream with call->workspace (call may be
 * NULL: as the functions without _ex). */
dpa_status_t dpa_attention_forward_ex(dpa_attention_t attention, const dpa_inputs_t* inputs,
                                      dpa_tensor_t o, dpa_tensor_t lse, const dpa_rng_state_t* rng,
                                      dpa_rng_state_t* rng_used, const dpa_call_t* call);
dpa_status_t dpa_attention_backward_ex(dpa_attention_t attention, const dpa_inputs_t* inputs,
                                       dpa_tensor_t o, dpa_tensor_t lse, dpa_tensor_t d_o,
                                       dpa_tensor_t dq, dpa_tensor_t dk, dpa_tensor_t dv,
                                       dpa_tensor_t dbias, dpa_tensor_t dsoftmax_offset,
                                       const dpa_rng_state_t* rng, const dpa_call_t* call);

/* The workspace bytes a call with these arguments needs (*bytes; 0 for host tensors). Validates
 * and selects as the call would; writes nothing else. */
dpa_status_t dpa_attention_forward_workspace_size(dpa_attention_t attention,
                                                  const dpa_inputs_t* inputs, dpa_tensor_t o,
                                                  dpa_tensor_t lse, const dpa_rng_state_t* rng,
                                                  size_t* bytes);
dpa_status_t dpa_attention_backward_workspace_size(
    dpa_attention_t attention, const dpa_inputs_t* inputs, dpa_tensor_t o, dpa_tensor_t lse,
    dpa_tensor_t d_o, dpa_tensor_t dq, dpa_tensor_t dk, dpa_tensor_t dv, dpa_tensor_t dbias,
    dpa_tensor_t dsoftmax_offset, const dpa_rng_state_t* rng, size_t* bytes);

/* Attention over a KV cache (docs/kvcache.md, dpa/kvcache.h): decode and chunked prefill over a
 * contiguous or paged cache, appending k_new / v_new first. Host or device tensors; on the
 * device the tables' contents are the caller's contract (DPA_KVCACHE_CHECK_TABLES=1 checks
 * them). */
#define DPA_KVCACHE_CONFIG_VERSION 1

typedef struct {
  size_t size;          /* sizeof(dpa_kvcache_config_t) */
  uint32_t version;     /* DPA_KVCACHE_CONFIG_VERSION */
  int32_t causal;       /* bottom-right aligned */
  int64_t window_left;  /* -1 unbounded */
  int64_t window_right; /* -1 unbounded */
  double softcap;       /* 0 disables */
  double scale;         /* 0 means 1/sqrt(d) */
  int32_t softmax_type;
  int32_t backend; /* dpa_backend_t */
} dpa_kvcache_config_t;

/* Field by field: size, version, causal (0), window_left (-1), window_right (-1), softcap (0:
 * off), scale (0: 1/sqrt(d)), softmax_type, backend (auto). */
#define DPA_KVCACHE_CONFIG_INITIALIZER                                             \
  {                                                                                \
    sizeof(dpa_kvcache_config_t), DPA_KVCACHE_CONFIG_VERSION, 0, -1, -1, 0.0, 0.0, \
        DPA_SOFTMAX_VANILLA, DPA_BACKEND_AUTO                                      \
  }

/* The shapes of dpa::KvCacheArgs; unused tensors have ndim 0. */
typedef struct {
  dpa_tensor_t q, cu_seqlens_q;
  dpa_tensor_t k_cache, v_cache, block_table, cache_seqlens;
  dpa_tensor_t k_new, v_new, cu_seqlens_k_new;
  dpa_tensor_t alibi_slopes, softmax_offset;
} dpa_kvcache_inputs_t;

typedef struct dpa_kvcache_s* dpa_kvcache_t;

dpa_status_t dpa_kvcache_create(const dpa_kvcache_config_t* config, dpa_kvcache_t* out);
dpa_status_t dpa_kvcache_destroy(dpa_kvcache_t kvcache);
/* Appends into the cache, then writes o (and lse, unless its ndim is 0). On failure neither the
 * cache nor the outputs have been written. */
dpa_status_t dpa_kvcache_forward(dpa_kvcache_t kvcache, const dpa_kvcache_inputs_t* inputs,
                                 dpa_tensor_t o, dpa_tensor_t lse);
/* As dpa_kvcache_forward, on call->stream with call->workspace (call may be NULL: the default
 * stream and the driver's pool). */
dpa_status_t dpa_kvcache_forward_ex(dpa_kvcache_t kvcache, const dpa_kvcache_inputs_t* inputs,
                                    dpa_tensor_t o, dpa_tensor_t lse, const dpa_call_t* call);
/* The workspace bytes such a call needs (*bytes; 0 for host tensors and single-split calls).
 * Validates as the call would; writes nothing else. */
dpa_status_t dpa_kvcache_workspace_size(dpa_kvcache_t kvcache, const dpa_kvcache_inputs_t* inputs,
                                        dpa_tensor_t o, dpa_tensor_t lse, size_t* bytes);

/* The message of the last failed call on this thread ("" if none). */
const char* dpa_last_error(void);
const char* dpa_status_string(dpa_status_t status);

#ifdef __cplusplus
}
#endif

#endif /* DPA_C_API_H_ */
