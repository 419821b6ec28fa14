// The C ABI's bad-input corpus (issue 15): each case mutates one good call and must get its
// status code, a dpa_last_error() that names the argument, and outputs left as they were.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "dpa/c_api.h"

namespace {

constexpr float kSentinel = 777.0f;

// A good call: q [1, 3, 2, 4], k and v [1, 5, 1, 4] (GQA 2:1), fp32 on the host; o, lse and the
// gradients start as the sentinel. Cases change any part of it.
struct Call {
  std::vector<float> q = std::vector<float>(24), k = std::vector<float>(20),
                     v = std::vector<float>(20), d_o = std::vector<float>(24);
  std::vector<float> o = std::vector<float>(24, kSentinel), lse = std::vector<float>(6, kSentinel);
  std::vector<float> dq = std::vector<float>(24, kSentinel), dk = std::vector<float>(20, kSentinel),
                     dv = std::vector<float>(20, kSentinel);
  std::vector<float> aux = std::vector<float>(256, 0.25f);  // bias, slopes, offsets
  std::vector<int32_t> ints = {0, 3, 5, 0, 0, 0};
  std::vector<unsigned char> mask = std::vector<unsigned char>(64, 0);
  dpa_config_t config = DPA_CONFIG_INITIALIZER;
  dpa_inputs_t in{};
  dpa_tensor_t o_view{}, lse_view{}, do_view{}, dq_view{}, dk_view{}, dv_view{};
  dpa_tensor_t dbias{}, dsoftmax_offset{};
  bool backward = false;
  dpa_call_t call = DPA_CALL_INITIALIZER;
  bool use_call = false;

  Call() {
    for (size_t i = 0; i < q.size(); ++i) q[i] = d_o[i] = float(std::sin(0.7 * double(i)));
    for (size_t i = 0; i < k.size(); ++i) k[i] = v[i] = float(std::cos(0.3 * double(i)));
    config.backend = DPA_BACKEND_CPU_EXACT;
    in.q = view(q.data(), DPA_FLOAT32, {1, 3, 2, 4});
    in.k = view(k.data(), DPA_FLOAT32, {1, 5, 1, 4});
    in.v = view(v.data(), DPA_FLOAT32, {1, 5, 1, 4});
    o_view = view(o.data(), DPA_FLOAT32, {1, 3, 2, 4});
    lse_view = view(lse.data(), DPA_FLOAT32, {1, 2, 3});
    do_view = view(d_o.data(), DPA_FLOAT32, {1, 3, 2, 4});
    dq_view = view(dq.data(), DPA_FLOAT32, {1, 3, 2, 4});
    dk_view = view(dk.data(), DPA_FLOAT32, {1, 5, 1, 4});
    dv_view = view(dv.data(), DPA_FLOAT32, {1, 5, 1, 4});
  }

  static dpa_tensor_t view(void* data, dpa_dtype_t dtype, std::vector<int64_t> shape) {
    return dpa_tensor_contiguous(data, dtype, int32_t(shape.size()), shape.data());
  }
  dpa_tensor_t aux_view(dpa_dtype_t dtype, std::vector<int64_t> shape) {
    return view(aux.data(), dtype, std::move(shape));
  }
  dpa_tensor_t int_view(std::vector<int64_t> shape) {
    return view(ints.data(), DPA_INT32, std::move(shape));
  }

  dpa_status_t run() {
    dpa_attention_t attention = nullptr;
    dpa_status_t status = dpa_attention_create(&config, &attention);
    if (status != DPA_SUCCESS) return status;
    const dpa_call_t* call_ptr = use_call ? &call : nullptr;
    if (backward) {
      status =
          dpa_attention_backward_ex(attention, &in, o_view, lse_view, do_view, dq_view, dk_view,
                                    dv_view, dbias, dsoftmax_offset, nullptr, call_ptr);
    } else {
      status =
          dpa_attention_forward_ex(attention, &in, o_view, lse_view, nullptr, nullptr, call_ptr);
    }
    dpa_attention_destroy(attention);
    return status;
  }

  bool outputs_untouched() const {
    for (const std::vector<float>* out : {&o, &lse, &dq, &dk, &dv})
      for (float x : *out)
        if (x != kSentinel) return false;
    return true;
  }
};

struct BadCall {
  std::string name;
  std::function<void(Call&)> mutate;
  dpa_status_t expected;
  std::string argument;  // must appear in dpa_last_error()
};

void PrintTo(const BadCall& bad, std::ostream* os) { *os << bad.name; }

class CApiCorpus : public ::testing::TestWithParam<BadCall> {};

TEST_P(CApiCorpus, RefusedNamingTheArgumentAndWritesNothing) {
  const BadCall& bad = GetParam();
  Call call;
  bad.mutate(call);
  const dpa_status_t status = call.run();
  EXPECT_EQ(status, bad.expected) << dpa_last_error();
  EXPECT_NE(std::string(dpa_last_error()).find(bad.argument), std::string::npos)
      << bad.name << ": '" << dpa_last_error() << "' does not name " << bad.argument;
  EXPECT_TRUE(call.outputs_untouched()) << bad.name;
}

TEST(CApiCorpusBase, TheGoodCallSucceedsAndWrites) {
  Call forward;
  ASSERT_EQ(forward.run(), DPA_SUCCESS) << dpa_last_error();
  EXPECT_NE(forward.o[0], kSentinel);
  Call backward;
  backward.backward = true;
  ASSERT_EQ(backward.run(), DPA_SUCCESS) << dpa_last_error();
  EXPECT_NE(backward.dq[0], kSentinel);
}

constexpr dpa_status_t kBad = DPA_INVALID_ARGUMENT;
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<BadCall> corpus() {
  std::vector<BadCall> c;
  auto add = [&](std::string name, std::function<void(Call&)> mutate, std::string argument,
                 dpa_status_t expected = kBad) {
    c.push_back({std::move(name), std::move(mutate), expected, std::move(argument)});
  };
  // Config values.
  add(
      "softcap_negative", [](Call& x) { x.config.softcap = -1; }, "softcap");
  add(
      "softcap_nan", [](Call& x) { x.config.softcap = kNan; }, "softcap");
  add(
      "softcap_inf", [](Call& x) { x.config.softcap = kInf; }, "softcap");
  add(
      "softcap_huge", [](Call& x) { x.config.softcap = 1e39; }, "softcap");
  add(
      "softcap_tiny", [](Call& x) { x.config.softcap = 1e-46; }, "softcap");
  add(
      "scale_negative", [](Call& x) { x.config.scale = -1; }, "scale");
  add(
      "scale_nan", [](Call& x) { x.config.scale = kNan; }, "scale");
  add(
      "scale_huge", [](Call& x) { x.config.scale = 1e39; }, "scale");
  add(
      "dropout_one", [](Call& x) { x.config.dropout = 1.0; }, "dropout");
  add(
      "dropout_negative", [](Call& x) { x.config.dropout = -0.5; }, "dropout");
  add(
      "dropout_nan", [](Call& x) { x.config.dropout = kNan; }, "dropout");
  add(
      "window_left_below", [](Call& x) { x.config.window_left = -2; }, "window_left");
  add(
      "window_right_below", [](Call& x) { x.config.window_right = -7; }, "window_right");
  add(
      "causal_window_right",
      [](Call& x) {
        x.config.mask_type = DPA_MASK_CAUSAL;
        x.config.window_right = 3;
      },
      "window_right");
  add(
      "mask_type_unknown", [](Call& x) { x.config.mask_type = 99; }, "mask_type");
  add(
      "softmax_type_unknown", [](Call& x) { x.config.softmax_type = 7; }, "softmax_type");
  add(
      "bias_type_unknown", [](Call& x) { x.config.bias_type = 5; }, "bias_type");
  add(
      "format_unknown", [](Call& x) { x.config.format = 9; }, "format");
  add(
      "backend_unknown", [](Call& x) { x.config.backend = 42; }, "backend");
  add(
      "config_version", [](Call& x) { x.config.version = 2; }, "config");
  add(
      "config_size", [](Call& x) { x.config.size = 3; }, "config");
  // q, k, v.
  add(
      "q_int32", [](Call& x) { x.in.q.dtype = DPA_INT32; }, "q");
  add(
      "q_bool", [](Call& x) { x.in.q.dtype = DPA_BOOL; }, "q");
  add(
      "k_other_dtype", [](Call& x) { x.in.k.dtype = DPA_FLOAT64; }, "k");
  add(
      "v_other_dtype", [](Call& x) { x.in.v.dtype = DPA_FLOAT16; }, "v");
  add(
      "q_missing", [](Call& x) { x.in.q = dpa_tensor_t{}; }, "q");
  add(
      "v_missing", [](Call& x) { x.in.v = dpa_tensor_t{}; }, "v");
  add(
      "q_three_dims", [](Call& x) { x.in.q.ndim = 3; }, "q");
  add(
      "q_six_dims", [](Call& x) { x.in.q.ndim = 6; }, "q");
  add(
      "q_negative_extent", [](Call& x) { x.in.q.shape[1] = -3; }, "q");
  add(
      "q_null_data", [](Call& x) { x.in.q.data = nullptr; }, "q");
  add(
      "q_head_dim_strided", [](Call& x) { x.in.q.strides[3] = 2; }, "q");
  add(
      "k_head_dim", [](Call& x) { x.in.k.shape[3] = 2; }, "k");
  add(
      "v_sequence", [](Call& x) { x.in.v.shape[1] = 4; }, "v");
  add(
      "k_batch", [](Call& x) { x.in.k.shape[0] = 2; }, "k");
  add(
      "heads_not_divisible",
      [](Call& x) {
        x.in.k.shape[2] = 3;
        x.in.v.shape[2] = 3;
      },
      "k");
  add(
      "q_on_cuda_the_rest_on_the_host", [](Call& x) { x.in.q.device = DPA_DEVICE_CUDA; }, "k");
  add(
      "k_on_another_device", [](Call& x) { x.in.k.device = DPA_DEVICE_CUDA; }, "k");
  add(
      "q_huge_extent", [](Call& x) { x.in.q.shape[0] = int64_t(1) << 40; }, "q");
  // Outputs.
  add(
      "o_wrong_shape", [](Call& x) { x.o_view.shape[1] = 2; }, "o");
  add(
      "o_other_dtype", [](Call& x) { x.o_view.dtype = DPA_FLOAT64; }, "o");
  add(
      "lse_wrong_shape", [](Call& x) { x.lse_view.shape[2] = 4; }, "lse");
  add(
      "lse_float64", [](Call& x) { x.lse_view.dtype = DPA_FLOAT64; }, "lse");
  add(
      "lse_strided", [](Call& x) { x.lse_view.strides[2] = 2; }, "lse");
  add(
      "lse_missing", [](Call& x) { x.lse_view = dpa_tensor_t{}; }, "lse");
  // Sinks, bias, ALiBi, masks, sequence tables.
  add(
      "learnable_without_offset", [](Call& x) { x.config.softmax_type = DPA_SOFTMAX_LEARNABLE; },
      "softmax_offset");
  add(
      "offset_wrong_shape",
      [](Call& x) {
        x.config.softmax_type = DPA_SOFTMAX_LEARNABLE;
        x.in.softmax_offset = x.aux_view(DPA_FLOAT32, {3});
      },
      "softmax_offset");
  add(
      "offset_float64",
      [](Call& x) {
        x.config.softmax_type = DPA_SOFTMAX_LEARNABLE;
        x.in.softmax_offset = x.aux_view(DPA_FLOAT64, {2});
      },
      "softmax_offset");
  add(
      "offset_nan",
      [](Call& x) {
        x.config.softmax_type = DPA_SOFTMAX_LEARNABLE;
        x.aux[1] = std::nanf("");
        x.in.softmax_offset = x.aux_view(DPA_FLOAT32, {2});
      },
      "softmax_offset");
  add(
      "offset_with_vanilla", [](Call& x) { x.in.softmax_offset = x.aux_view(DPA_FLOAT32, {2}); },
      "softmax_offset");
  add(
      "bias_type_without_bias", [](Call& x) { x.config.bias_type = DPA_BIAS_PRE_SCALE; }, "bias");
  add(
      "bias_without_bias_type",
      [](Call& x) {
        x.in.bias = x.aux_view(DPA_FLOAT32, {1, 2, 3, 5});
      },
      "bias");
  add(
      "bias_wrong_kv",
      [](Call& x) {
        x.config.bias_type = DPA_BIAS_POST_SCALE;
        x.in.bias = x.aux_view(DPA_FLOAT32, {1, 2, 3, 4});
      },
      "bias");
  add(
      "bias_integer",
      [](Call& x) {
        x.config.bias_type = DPA_BIAS_POST_SCALE;
        x.in.bias = x.view(x.ints.data(), DPA_INT32, {1, 1, 1, 5});
      },
      "bias");
  add(
      "alibi_wrong_shape", [](Call& x) { x.in.alibi_slopes = x.aux_view(DPA_FLOAT32, {3}); },
      "alibi_slopes");
  add(
      "alibi_float64", [](Call& x) { x.in.alibi_slopes = x.aux_view(DPA_FLOAT64, {2}); },
      "alibi_slopes");
  add(
      "alibi_inf",
      [](Call& x) {
        x.aux[0] = std::numeric_limits<float>::infinity();
        x.in.alibi_slopes = x.aux_view(DPA_FLOAT32, {2});
      },
      "alibi_slopes");
  add(
      "arbitrary_without_mask", [](Call& x) { x.config.mask_type = DPA_MASK_ARBITRARY; },
      "attn_mask");
  add(
      "mask_float",
      [](Call& x) {
        x.config.mask_type = DPA_MASK_ARBITRARY;
        x.in.attn_mask = x.aux_view(DPA_FLOAT32, {1, 1, 3, 5});
      },
      "attn_mask");
  add(
      "mask_without_arbitrary",
      [](Call& x) {
        x.in.attn_mask = x.view(x.mask.data(), DPA_BOOL, {1, 1, 3, 5});
      },
      "attn_mask");
  add(
      "cu_seqlens_wrong_length", [](Call& x) { x.in.cu_seqlens_q = x.int_view({3}); },
      "cu_seqlens_q");
  add(
      "cu_seqlens_int64",
      [](Call& x) {
        x.in.cu_seqlens_q = x.int_view({2});
        x.in.cu_seqlens_q.dtype = DPA_FLOAT32;
      },
      "cu_seqlens_q");
  add(
      "cu_seqlens_beyond_sequence",
      [](Call& x) {
        x.ints = {0, 9};
        x.in.cu_seqlens_kv = x.int_view({2});
      },
      "cu_seqlens_kv");
  add(
      "forced_backend_not_eligible", [](Call& x) { x.config.backend = DPA_BACKEND_CUDA_FLASH; },
      "cuda_flash", DPA_NOT_SUPPORTED);
  // The backward's own arguments.
  add(
      "backward_do_wrong_shape",
      [](Call& x) {
        x.backward = true;
        x.do_view.shape[1] = 2;
      },
      "d_o");
  add(
      "backward_dq_other_dtype",
      [](Call& x) {
        x.backward = true;
        x.dq_view.dtype = DPA_FLOAT64;
      },
      "dq");
  add(
      "backward_dk_wrong_shape",
      [](Call& x) {
        x.backward = true;
        x.dk_view.shape[2] = 2;
      },
      "dk");
  add(
      "backward_dbias_without_bias",
      [](Call& x) {
        x.backward = true;
        x.dbias = x.aux_view(DPA_FLOAT32, {1, 2, 3, 5});
      },
      "dbias");
  add(
      "backward_dalpha_without_learnable",
      [](Call& x) {
        x.backward = true;
        x.dsoftmax_offset = x.aux_view(DPA_FLOAT32, {2});
      },
      "dsoftmax_offset");
  // Outputs sharing memory with an input or another output (docs/hardening.md).
  add(
      "o_is_q",
      [](Call& x) {
        x.o_view = Call::view(x.q.data(), DPA_FLOAT32, {1, 3, 2, 4});
      },
      "o");
  add(
      "backward_dv_is_dk",
      [](Call& x) {
        x.backward = true;
        x.dv_view = x.dk_view;
      },
      "dv");
  // The call struct.
  add(
      "call_size_too_small",
      [](Call& x) {
        x.use_call = true;
        x.call.size = 4;
      },
      "call");
  add(
      "call_bytes_without_workspace",
      [](Call& x) {
        x.use_call = true;
        x.call.workspace_bytes = 1024;
      },
      "call");
  return c;
}

INSTANTIATE_TEST_SUITE_P(Cases, CApiCorpus, ::testing::ValuesIn(corpus()),
                         [](const ::testing::TestParamInfo<BadCall>& info) {
                           return info.param.name;
                         });

TEST(CApiCorpusSize, HasAtLeastFiftyCases) { EXPECT_GE(corpus().size(), 50u); }

}  // namespace
