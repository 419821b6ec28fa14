/* Compiled as C: proves dpa/c_api.h is a C header, and drives the ABI from C. */
#include <math.h>
#include <string.h>

#include "dpa/c_api.h"

/* A 1x3x2x4 query against 1x5x1x4 keys (GQA 2:1), fp32, with a cap and an off-by-one sink.
 * Returns the forward status; o[0] and lse[0] receive the first outputs. */
int dpa_c_forward_small(double softcap, int softmax_type, float* o_first, float* lse_first) {
  float q[1 * 3 * 2 * 4], k[1 * 5 * 1 * 4], v[1 * 5 * 1 * 4], o[1 * 3 * 2 * 4], lse[1 * 2 * 3];
  for (int i = 0; i < 24; ++i) q[i] = (float)sin(0.7 * i);
  for (int i = 0; i < 20; ++i) k[i] = (float)cos(0.3 * i);
  for (int i = 0; i < 20; ++i) v[i] = (float)(0.1 * i);
  for (int i = 0; i < 24; ++i) o[i] = 777.0f;
  for (int i = 0; i < 6; ++i) lse[i] = 777.0f;
  int64_t q_shape[4] = {1, 3, 2, 4}, kv_shape[4] = {1, 5, 1, 4}, lse_shape[3] = {1, 2, 3};
  dpa_config_t config = DPA_CONFIG_INITIALIZER;
  config.softcap = softcap;
  config.softmax_type = softmax_type;
  config.backend = DPA_BACKEND_CPU_EXACT;
  dpa_attention_t attention = NULL;
  dpa_status_t status = dpa_attention_create(&config, &attention);
  if (status != DPA_SUCCESS) return status;
  dpa_inputs_t inputs;
  memset(&inputs, 0, sizeof(inputs));
  inputs.q = dpa_tensor_contiguous(q, DPA_FLOAT32, 4, q_shape);
  inputs.k = dpa_tensor_contiguous(k, DPA_FLOAT32, 4, kv_shape);
  inputs.v = dpa_tensor_contiguous(v, DPA_FLOAT32, 4, kv_shape);
  status =
      dpa_attention_forward(attention, &inputs, dpa_tensor_contiguous(o, DPA_FLOAT32, 4, q_shape),
                            dpa_tensor_contiguous(lse, DPA_FLOAT32, 3, lse_shape), NULL, NULL);
  *o_first = o[0];
  *lse_first = lse[0];
  dpa_attention_destroy(attention);
  return status;
}

/* Forward with a bad sink offset shape; returns the status and leaves o untouched. */
int dpa_c_forward_bad_offset(float* o_first) {
  float q[8], k[8], v[8], o[8], lse[2], offset[3] = {0, 0, 0};
  for (int i = 0; i < 8; ++i) q[i] = k[i] = v[i] = (float)i, o[i] = 777.0f;
  int64_t shape[4] = {1, 2, 1, 4}, lse_shape[3] = {1, 1, 2}, offset_shape[1] = {3};
  dpa_config_t config = DPA_CONFIG_INITIALIZER;
  config.softmax_type = DPA_SOFTMAX_LEARNABLE;
  dpa_attention_t attention = NULL;
  dpa_status_t status = dpa_attention_create(&config, &attention);
  if (status != DPA_SUCCESS) return -1;
  dpa_inputs_t inputs;
  memset(&inputs, 0, sizeof(inputs));
  inputs.q = dpa_tensor_contiguous(q, DPA_FLOAT32, 4, shape);
  inputs.k = dpa_tensor_contiguous(k, DPA_FLOAT32, 4, shape);
  inputs.v = dpa_tensor_contiguous(v, DPA_FLOAT32, 4, shape);
  inputs.softmax_offset = dpa_tensor_contiguous(offset, DPA_FLOAT32, 1, offset_shape);
  status =
      dpa_attention_forward(attention, &inputs, dpa_tensor_contiguous(o, DPA_FLOAT32, 4, shape),
                            dpa_tensor_contiguous(lse, DPA_FLOAT32, 3, lse_shape), NULL, NULL);
  *o_first = o[0];
  dpa_attention_destroy(attention);
  return status;
}

/* The _ex forward on a host call: the size query (0 for host tensors) and a call struct whose
 * size field is `call_size`. Returns the forward status; o[0] goes to o_first. */
int dpa_c_forward_ex_small(size_t call_size, size_t* workspace_bytes, float* o_first) {
  float q[8], o[8], lse[2];
  for (int i = 0; i < 8; ++i) q[i] = (float)sin(0.5 * i), o[i] = 777.0f;
  int64_t shape[4] = {1, 2, 1, 4}, lse_shape[3] = {1, 1, 2};
  dpa_config_t config = DPA_CONFIG_INITIALIZER;
  dpa_attention_t attention = NULL;
  dpa_status_t status = dpa_attention_create(&config, &attention);
  if (status != DPA_SUCCESS) return -1;
  dpa_inputs_t inputs;
  memset(&inputs, 0, sizeof(inputs));
  inputs.q = inputs.k = inputs.v = dpa_tensor_contiguous(q, DPA_FLOAT32, 4, shape);
  dpa_tensor_t o_view = dpa_tensor_contiguous(o, DPA_FLOAT32, 4, shape);
  dpa_tensor_t lse_view = dpa_tensor_contiguous(lse, DPA_FLOAT32, 3, lse_shape);
  status = dpa_attention_forward_workspace_size(attention, &inputs, o_view, lse_view, NULL,
                                                workspace_bytes);
  if (status != DPA_SUCCESS) return -2;
  dpa_call_t call = DPA_CALL_INITIALIZER;
  call.size = call_size;
  status = dpa_attention_forward_ex(attention, &inputs, o_view, lse_view, NULL, NULL, &call);
  *o_first = o[0];
  dpa_attention_destroy(attention);
  return status;
}

/* One decode step over a paged cache (pages of 2 rows, a pool of 3, G = 1, H = 2, d = 4):
 * three cached tokens on pages 2 and 0 (block_table {2, 0}), one appended (position 3: page 0,
 * row 1), causal, with a cap. first_page: the table's first entry (3 is outside the pool).
 * Returns the status; o receives the 8 outputs and appended the 4 cache values at position 3.
 * entry: 0 dpa_kvcache_forward, 1 dpa_kvcache_forward_ex with DPA_CALL_INITIALIZER, 2 the same
 * with a workspace of dpa_kvcache_workspace_size's bytes (0 on the host: the block goes unused),
 * 3 with a workspace off its 256-byte boundary (refused naming workspace). */
int dpa_c_kvcache_decode(int32_t first_page, int entry, float* o, float* appended) {
  float q[2 * 4], k_cache[3 * 2 * 4], v_cache[3 * 2 * 4], k_new[4], v_new[4];
  int32_t table[2], seqlens[1] = {3};
  for (int i = 0; i < 8; ++i) q[i] = (float)sin(0.9 * i), o[i] = 777.0f;
  for (int i = 0; i < 24; ++i) k_cache[i] = (float)cos(0.4 * i), v_cache[i] = (float)(0.05 * i);
  for (int i = 0; i < 4; ++i) k_new[i] = (float)(0.5 - 0.2 * i), v_new[i] = (float)(1.0 + i);
  table[0] = first_page;
  table[1] = 0;
  int64_t q_shape[4] = {1, 1, 2, 4}, cache_shape[4] = {3, 2, 1, 4}, new_shape[4] = {1, 1, 1, 4};
  int64_t table_shape[2] = {1, 2}, seqlens_shape[1] = {1};
  dpa_kvcache_config_t config = DPA_KVCACHE_CONFIG_INITIALIZER;
  config.causal = 1;
  config.softcap = 2.0;
  config.backend = DPA_BACKEND_CPU_EXACT;
  dpa_kvcache_t kvcache = NULL;
  dpa_status_t status = dpa_kvcache_create(&config, &kvcache);
  if (status != DPA_SUCCESS) return status;
  dpa_kvcache_inputs_t inputs;
  memset(&inputs, 0, sizeof(inputs));
  inputs.q = dpa_tensor_contiguous(q, DPA_FLOAT32, 4, q_shape);
  inputs.k_cache = dpa_tensor_contiguous(k_cache, DPA_FLOAT32, 4, cache_shape);
  inputs.v_cache = dpa_tensor_contiguous(v_cache, DPA_FLOAT32, 4, cache_shape);
  inputs.block_table = dpa_tensor_contiguous(table, DPA_INT32, 2, table_shape);
  inputs.cache_seqlens = dpa_tensor_contiguous(seqlens, DPA_INT32, 1, seqlens_shape);
  inputs.k_new = dpa_tensor_contiguous(k_new, DPA_FLOAT32, 4, new_shape);
  inputs.v_new = dpa_tensor_contiguous(v_new, DPA_FLOAT32, 4, new_shape);
  dpa_tensor_t none;
  memset(&none, 0, sizeof(none));
  dpa_call_t call = DPA_CALL_INITIALIZER;
  static _Alignas(256) unsigned char scratch[512];
  dpa_tensor_t o_view = dpa_tensor_contiguous(o, DPA_FLOAT32, 4, q_shape);
  if (entry >= 2) {
    size_t bytes = 99;
    status = dpa_kvcache_workspace_size(kvcache, &inputs, o_view, none, &bytes);
    if (status != DPA_SUCCESS || bytes != 0) {
      dpa_kvcache_destroy(kvcache);
      return status != DPA_SUCCESS ? (int)status : -1;
    }
    call.workspace = entry == 2 ? scratch : scratch + 8;
    call.workspace_bytes = 64;
  }
  status = entry == 0 ? dpa_kvcache_forward(kvcache, &inputs, o_view, none)
                      : dpa_kvcache_forward_ex(kvcache, &inputs, o_view, none, &call);
  for (int i = 0; i < 4; ++i) appended[i] = k_cache[(0 * 2 + 1) * 4 + i];
  dpa_kvcache_destroy(kvcache);
  return status;
}
