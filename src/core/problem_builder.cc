#include "core/problem_builder.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "core/device_access.h"
#include "core/int32_tables.h"
#include "core/philox.h"

namespace dpa {
namespace {

std::string str(int64_t value) { return std::to_string(value); }

// The largest batch, sequence, head count or head dim (kernels index them with int32).
constexpr int64_t kMaxExtent = (int64_t(1) << 31) - 1;

void require_defined(const TensorView& t, const char* name, bool needs_data) {
  require(t.ndim > 0, name, "is required");
  if (needs_data) require(t.data != nullptr || t.numel() == 0, name, "has a null data pointer");
}

void require_device(const TensorView& t, const char* name, Device device, int device_index) {
  require(
      t.device == device && (device == Device::kCPU || t.device_index == device_index), name,
      [&] { return "must be on the same device as q (" + std::string(to_string(device)) + ")"; });
}

void require_dtype(const TensorView& t, const char* name, DType dtype) {
  require(t.dtype == dtype, name, [&] {
    return "must have dtype " + std::string(to_string(dtype)) + ", got " +
           std::string(to_string(t.dtype));
  });
}

void require_shape(const TensorView& t, const char* name, std::initializer_list<int64_t> shape) {
  bool same = t.ndim == int(shape.size());
  int d = 0;
  for (int64_t extent : shape) same = same && t.shape[d++] == extent;
  require(same, name, [&] {
    std::string expected = "[";
    int n = 0;
    for (int64_t extent : shape) expected += (n++ ? ", " : "") + str(extent);
    return "must have shape " + expected + "], got " + t.shape_string();
  });
}

void require_contiguous(const TensorView& t, const char* name) {
  require(t.is_contiguous(), name, "must be contiguous");
}

void require_non_negative_shape(const TensorView& t, const char* name) {
  require(t.ndim >= 0 && t.ndim <= kMaxDims, name, "has an invalid number of dimensions");
  for (int d = 0; d < t.ndim; ++d) require(t.shape[d] >= 0, name, "has a negative extent");
}

// [.., s, heads, d] row layout of a q/k/v-like tensor in the configured format.
RowLayout row_layout(const TensorView& t, Format format) {
  RowLayout layout;
  if (format == Format::kBSHD) {
    layout.stride_batch = t.strides[0];
    layout.stride_seq = t.strides[1];
  } else if (format == Format::kSBHD) {
    layout.stride_seq = t.strides[0];
    layout.stride_batch = t.strides[1];
  } else {
    layout.stride_seq = t.strides[0];
  }
  layout.stride_head = t.strides[t.ndim - 2];
  return layout;
}

struct QkvShape {
  int64_t batch = 0, seq = 0, heads = 0, dim = 0;
};

QkvShape qkv_shape(const TensorView& t, Format format, const char* name) {
  const int expected_ndim = format == Format::kTHD ? 3 : 4;
  require(t.ndim == expected_ndim, name, [&] {
    return "must have " + str(expected_ndim) + " dimensions for format " +
           std::string(to_string(format)) + ", got " + t.shape_string();
  });
  require(t.strides[t.ndim - 1] == 1 || t.shape[t.ndim - 1] == 1, name,
          "must have a contiguous head dimension (last stride 1)");
  QkvShape s;
  if (format == Format::kBSHD) s = {t.shape[0], t.shape[1], t.shape[2], t.shape[3]};
  if (format == Format::kSBHD) s = {t.shape[1], t.shape[0], t.shape[2], t.shape[3]};
  if (format == Format::kTHD) s = {1, t.shape[0], t.shape[1], t.shape[2]};
  require(s.heads > 0, name, "must have at least one head");
  require(s.dim > 0, name, "must have a head dimension > 0");
  // The kernels index batches, rows, heads and channels with int32, and the problem holds
  // per-sequence tables of b entries: a bound here turns 2^40 sequences into a named error
  // instead of a bare bad_alloc.
  for (int64_t extent : {s.batch, s.seq, s.heads, s.dim})
    require(extent <= kMaxExtent, name, [&] {
      return "has an extent above 2^31 - 1 (" + str(extent) + "), beyond what dpa indexes";
    });
  return s;
}

void require_same_layout_shape(const TensorView& t, const TensorView& like, int64_t dim,
                               const char* name, const char* like_name) {
  bool same = t.ndim == like.ndim;
  for (int d = 0; same && d + 1 < like.ndim; ++d) same = t.shape[d] == like.shape[d];
  same = same && t.shape[t.ndim - 1] == dim;
  require(same, name, [&] {
    return "must have the shape of " + std::string(like_name) + " with last dim " + str(dim) +
           ", got " + t.shape_string();
  });
  require(t.strides[t.ndim - 1] == 1 || dim == 1, name,
          "must have a contiguous head dimension (last stride 1)");
}

// Caps and scales are validated as doubles but used in fp32 by the kernels and the cpu backend:
// 1e-30 keeps scale / cap and cap * tanh(...) far from fp32's denormals and 1e30 keeps
// scale * q.k from overflowing for any logit below 3e8 (fp32's largest value is 3.4e38).
constexpr double kMinConfigMagnitude = 1e-30;
constexpr double kMaxConfigMagnitude = 1e30;

bool in_representable_range(double value) {
  return value >= kMinConfigMagnitude && value <= kMaxConfigMagnitude;
}

// %g: std::to_string prints 1e-46 as 0.000000.
std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

void check_cu_seqlens_tensor(const TensorView& t, const char* name, int64_t batch, Device device) {
  require(t.ndim == 1, name,
          [&] { return "must be a 1-D int32 tensor [b + 1], got " + t.shape_string(); });
  require_dtype(t, name, DType::kInt32);
  if (batch >= 0)
    require(t.shape[0] == batch + 1, name, [&] {
      return "must have b + 1 = " + str(batch + 1) + " entries, got " + str(t.shape[0]);
    });
  require(t.shape[0] >= 1, name, "must have at least one entry");
  // Contents are validated on the host: device-resident tables (b + 1 integers) are copied.
  require(t.device == Device::kCPU || t.device == device, name,
          "must be on the host or on the device of q");
}

// thd sequence starts: the padded offsets when given (gaps allowed), else cu_seqlens itself.
std::vector<int64_t> thd_starts(const std::vector<int64_t>& cu, const std::vector<int64_t>& lengths,
                                const TensorView& padded, const char* padded_name, int64_t total,
                                const char* total_name, void* stream) {
  std::vector<int64_t> starts(lengths.size());
  if (padded.ndim == 0) {
    for (size_t b = 0; b < lengths.size(); ++b) starts[b] = cu[b];
    require(cu.back() <= total, total_name,
            [&] { return "has " + str(total) + " rows but cu_seqlens ends at " + str(cu.back()); });
    return starts;
  }
  std::vector<int64_t> offsets = read_int32_vector(padded, stream);
  require(offsets[0] >= 0, padded_name, "must start at a non-negative row");
  for (size_t b = 0; b < lengths.size(); ++b) {
    starts[b] = offsets[b];
    require(offsets[b + 1] >= offsets[b] + lengths[b], padded_name, [&] {
      return "must leave room for each sequence (sequence " + str(int64_t(b)) + " has length " +
             str(lengths[b]) + " but its slot is " + str(offsets[b + 1] - offsets[b]) + ")";
    });
  }
  require(offsets.back() <= total, padded_name, [&] {
    return "ends at row " + str(offsets.back()) + " beyond the " + str(total) +
           " rows of the tensor";
  });
  return starts;
}

// A [b|1, H|1, sq|1, skv|1] tensor; `full_rows_and_cols` demands sq and skv unbroadcast.
BroadcastLayout broadcast_layout(const TensorView& t, const char* name, int64_t batch,
                                 int64_t heads, int64_t sq, int64_t skv, bool allow_row_broadcast,
                                 bool allow_col_broadcast) {
  require(t.ndim == 4, name,
          [&] { return "must have 4 dimensions [b|1, H|1, sq|1, skv], got " + t.shape_string(); });
  auto check_dim = [&](int d, int64_t full, bool allow_one, const char* what) {
    require(t.shape[d] == full || (allow_one && t.shape[d] == 1), name, [&] {
      return std::string("dimension ") + str(d) + " (" + what + ") must be " + str(full) +
             (allow_one ? " or 1" : "") + ", got " + str(t.shape[d]) + " in " + t.shape_string();
    });
  };
  check_dim(0, batch, true, "batch");
  check_dim(1, heads, true, "heads");
  check_dim(2, sq, allow_row_broadcast, "query positions");
  check_dim(3, skv, allow_col_broadcast, "key positions");
  return BroadcastLayout::of(t);
}

// Resolves everything shared by forward, backward and explain.
AttentionProblem resolve(const AttentionConfig& config, const AttentionInputs& in, Pass pass,
                         bool read_contents, void* stream) {
  validate_config(config);
  AttentionProblem p;
  p.pass = pass;
  p.format = config.format;
  p.stream = stream;

  require_defined(in.q, "q", read_contents);
  require_defined(in.k, "k", read_contents);
  require_defined(in.v, "v", read_contents);
  require_non_negative_shape(in.q, "q");
  require_non_negative_shape(in.k, "k");
  require_non_negative_shape(in.v, "v");
  require(is_floating(in.q.dtype), "q", "must be a floating-point tensor");
  require_dtype(in.k, "k", in.q.dtype);
  require_dtype(in.v, "v", in.q.dtype);
  p.dtype = in.q.dtype;
  p.device = in.q.device;
  p.device_index = in.q.device_index;
  if (p.device == Device::kCUDA && device_access() != nullptr)
    p.device_arch = device_access()->arch(p.device_index);
  require_device(in.k, "k", p.device, in.q.device_index);
  require_device(in.v, "v", p.device, in.q.device_index);

  const QkvShape q = qkv_shape(in.q, config.format, "q");
  const QkvShape k = qkv_shape(in.k, config.format, "k");
  const QkvShape v = qkv_shape(in.v, config.format, "v");
  require(k.batch == q.batch, "k",
          [&] { return "batch size " + str(k.batch) + " differs from q's " + str(q.batch); });
  require(v.batch == q.batch, "v",
          [&] { return "batch size " + str(v.batch) + " differs from q's " + str(q.batch); });
  require(v.seq == k.seq, "v",
          [&] { return "sequence length " + str(v.seq) + " differs from k's " + str(k.seq); });
  require(v.heads == k.heads, "v",
          [&] { return "head count " + str(v.heads) + " differs from k's " + str(k.heads); });
  require(k.dim == q.dim, "k",
          [&] { return "head dim " + str(k.dim) + " differs from q's " + str(q.dim); });
  require(q.heads % k.heads == 0, "k", [&] {
    return "query heads H = " + str(q.heads) +
           " must be a multiple of KV heads G = " + str(k.heads);
  });

  p.heads_q = q.heads;
  p.heads_kv = k.heads;
  p.head_dim_qk = q.dim;
  p.head_dim_v = v.dim;
  p.q = in.q;
  p.k = in.k;
  p.v = in.v;
  p.q_rows = row_layout(in.q, config.format);
  p.k_rows = row_layout(in.k, config.format);
  p.v_rows = row_layout(in.v, config.format);

  // Sequence lengths.
  const bool thd = config.format == Format::kTHD;
  require(thd || in.cu_seqlens_q_padded.ndim == 0, "cu_seqlens_q_padded",
          "is only used with format thd");
  require(thd || in.cu_seqlens_kv_padded.ndim == 0, "cu_seqlens_kv_padded",
          "is only used with format thd");
  if (thd) {
    require(in.cu_seqlens_q.ndim > 0, "cu_seqlens_q", "is required with format thd");
    require(in.cu_seqlens_kv.ndim > 0, "cu_seqlens_kv", "is required with format thd");
    check_cu_seqlens_tensor(in.cu_seqlens_q, "cu_seqlens_q", -1, p.device);
    p.batch = in.cu_seqlens_q.shape[0] - 1;
    require(p.batch <= kMaxExtent, "cu_seqlens_q", [&] {
      return "has " + str(p.batch + 1) + " entries: more sequences than dpa indexes (2^31 - 1)";
    });
    check_cu_seqlens_tensor(in.cu_seqlens_kv, "cu_seqlens_kv", p.batch, p.device);
    if (in.cu_seqlens_q_padded.ndim)
      check_cu_seqlens_tensor(in.cu_seqlens_q_padded, "cu_seqlens_q_padded", p.batch, p.device);
    if (in.cu_seqlens_kv_padded.ndim)
      check_cu_seqlens_tensor(in.cu_seqlens_kv_padded, "cu_seqlens_kv_padded", p.batch, p.device);
    p.total_q = q.seq;
    p.total_kv = k.seq;
    p.has_padded_offsets = in.cu_seqlens_q_padded.ndim > 0 || in.cu_seqlens_kv_padded.ndim > 0;
  } else {
    p.batch = q.batch;
    if (in.cu_seqlens_q.ndim)
      check_cu_seqlens_tensor(in.cu_seqlens_q, "cu_seqlens_q", p.batch, p.device);
    if (in.cu_seqlens_kv.ndim)
      check_cu_seqlens_tensor(in.cu_seqlens_kv, "cu_seqlens_kv", p.batch, p.device);
    p.max_seqlen_q = q.seq;
    p.max_seqlen_kv = k.seq;
  }

  if (read_contents) {
    // Each table is read once: for device tensors every read is a copy and a stream sync.
    const std::vector<int64_t> cu_q =
        in.cu_seqlens_q.ndim ? read_int32_vector(in.cu_seqlens_q, stream) : std::vector<int64_t>{};
    const std::vector<int64_t> cu_kv = in.cu_seqlens_kv.ndim
                                           ? read_int32_vector(in.cu_seqlens_kv, stream)
                                           : std::vector<int64_t>{};
    auto lengths = [&](const std::vector<int64_t>& cu, const char* name, int64_t full) {
      if (cu.empty()) return std::vector<int64_t>(size_t(p.batch), full);
      std::vector<int64_t> lens = lengths_from_cu(cu, name);
      if (!thd)
        for (int64_t len : lens)
          require(len <= full, name, [&] {
            return "gives a sequence length " + str(len) + " beyond the tensor's " + str(full);
          });
      return lens;
    };
    p.seqlen_q = lengths(cu_q, "cu_seqlens_q", q.seq);
    p.seqlen_kv = lengths(cu_kv, "cu_seqlens_kv", k.seq);
    if (thd) {
      p.seq_start_q = thd_starts(cu_q, p.seqlen_q, in.cu_seqlens_q_padded, "cu_seqlens_q_padded",
                                 p.total_q, "q", stream);
      p.seq_start_kv = thd_starts(cu_kv, p.seqlen_kv, in.cu_seqlens_kv_padded,
                                  "cu_seqlens_kv_padded", p.total_kv, "k", stream);
      for (int64_t len : p.seqlen_q) p.max_seqlen_q = std::max(p.max_seqlen_q, len);
      for (int64_t len : p.seqlen_kv) p.max_seqlen_kv = std::max(p.max_seqlen_kv, len);
    }
  } else {
    // Explain: lengths unknown; assume full (thd: every sequence could be the whole tensor).
    p.seqlen_q.assign(size_t(p.batch), thd ? p.total_q : q.seq);
    p.seqlen_kv.assign(size_t(p.batch), thd ? p.total_kv : k.seq);
    if (thd) {
      p.seq_start_q.assign(size_t(p.batch), 0);
      p.seq_start_kv.assign(size_t(p.batch), 0);
      p.max_seqlen_q = p.total_q;
      p.max_seqlen_kv = p.total_kv;
    }
  }
  if (thd) {
    p.q_rows.seq_start = p.seq_start_q.data();
    p.k_rows.seq_start = p.seq_start_kv.data();
    p.v_rows.seq_start = p.seq_start_kv.data();
  }

  // Features.
  p.scale = config.scale ? *config.scale : 1.0 / std::sqrt(double(q.dim));
  p.softcap = config.softcap;
  p.layer_number = config.layer_number;
  p.mask_type = config.mask_type;
  p.window_left = config.window_left;
  p.window_right = mask_is_causal(config.mask_type) ? 0 : config.window_right;
  p.bottom_right = mask_bottom_right(config.mask_type, config.bottom_right_diagonal);
  p.softmax_type = config.softmax_type;
  p.bias_type = config.bias_type;
  p.deterministic = config.deterministic;
  p.flash_forward_kernel = config.flash_forward_kernel;
  p.flash_backward_kernel = config.flash_backward_kernel;

  auto require_aux = [&](const TensorView& t, const char* name) {
    require_defined(t, name, read_contents);
    require_non_negative_shape(t, name);
    require_device(t, name, p.device, in.q.device_index);
  };

  // Bias.
  if (config.bias_type == BiasType::kNoBias) {
    require(in.bias.ndim == 0, "bias", "is given but bias_type is no_bias");
  } else {
    require(in.bias.ndim > 0, "bias", [&] {
      return "is required with bias_type " + std::string(to_string(config.bias_type));
    });
    require_aux(in.bias, "bias");
    require(is_floating(in.bias.dtype), "bias", "must be a floating-point tensor");
    p.bias = in.bias;
    p.bias_layout = broadcast_layout(in.bias, "bias", p.batch, p.heads_q, p.max_seqlen_q,
                                     p.max_seqlen_kv, true, false);
  }

  // ALiBi slopes: fp32 [H] or [b, H].
  if (in.alibi_slopes.ndim > 0) {
    require_aux(in.alibi_slopes, "alibi_slopes");
    require_dtype(in.alibi_slopes, "alibi_slopes", DType::kFloat32);
    require_contiguous(in.alibi_slopes, "alibi_slopes");
    const bool per_head = in.alibi_slopes.ndim == 1 && in.alibi_slopes.shape[0] == p.heads_q;
    const bool per_batch = in.alibi_slopes.ndim == 2 && in.alibi_slopes.shape[0] == p.batch &&
                           in.alibi_slopes.shape[1] == p.heads_q;
    require(per_head || per_batch, "alibi_slopes", [&] {
      return "must have shape [H] = [" + str(p.heads_q) + "] or [b, H] = [" + str(p.batch) + ", " +
             str(p.heads_q) + "], got " + in.alibi_slopes.shape_string();
    });
    p.has_alibi = true;
    p.alibi_slopes = in.alibi_slopes;
    p.alibi_stride_batch = per_batch ? p.heads_q : 0;
    // Like the sink offsets: checked where they can be read without a device synchronisation.
    if (read_contents && in.alibi_slopes.device == Device::kCPU) {
      const float* slopes = static_cast<const float*>(in.alibi_slopes.data);
      for (int64_t n = 0; n < in.alibi_slopes.numel(); ++n)
        require(std::isfinite(slopes[n]), "alibi_slopes", [&] {
          return "must be finite (entry " + str(n) + " is " + number(slopes[n]) + ")";
        });
    }
  }

  // Sink offsets.
  if (config.softmax_type == SoftmaxType::kLearnable) {
    require(in.softmax_offset.ndim > 0, "softmax_offset",
            "is required with softmax_type learnable (fp32 [H])");
    require_aux(in.softmax_offset, "softmax_offset");
    require_dtype(in.softmax_offset, "softmax_offset", DType::kFloat32);
    require_shape(in.softmax_offset, "softmax_offset", {p.heads_q});
    require_contiguous(in.softmax_offset, "softmax_offset");
    p.softmax_offset = in.softmax_offset;
    // Values are checked where they can be read without a device synchronisation.
    if (read_contents && in.softmax_offset.device == Device::kCPU) {
      const float* alpha = static_cast<const float*>(in.softmax_offset.data);
      for (int64_t h = 0; h < p.heads_q; ++h)
        require(!std::isnan(alpha[h]) && alpha[h] != INFINITY, "softmax_offset",
                [&] { return "must not contain NaN or +inf (head " + str(h) + ")"; });
    }
  } else {
    require(in.softmax_offset.ndim == 0, "softmax_offset", [&] {
      return "is only used with softmax_type learnable (got " +
             std::string(to_string(config.softmax_type)) + ")";
    });
  }

  // Arbitrary mask.
  if (config.mask_type == MaskType::kArbitrary) {
    require(in.attn_mask.ndim > 0, "attn_mask", "is required with mask_type arbitrary");
    require_aux(in.attn_mask, "attn_mask");
    require_dtype(in.attn_mask, "attn_mask", DType::kBool);
    p.mask_layout = broadcast_layout(in.attn_mask, "attn_mask", p.batch, p.heads_q, p.max_seqlen_q,
                                     p.max_seqlen_kv, false, false);
    p.has_attn_mask = true;
    p.attn_mask = in.attn_mask;
  } else {
    require(in.attn_mask.ndim == 0, "attn_mask", "is only used with mask_type arbitrary");
  }
  return p;
}

void set_dropout(AttentionProblem& p, double dropout, const RngState& rng) {
  require(std::isfinite(dropout) && dropout >= 0.0 && dropout < 1.0, "dropout",
          [&] { return "must be in [0, 1), got " + std::to_string(dropout); });
  p.dropout = dropout;
  p.dropout_threshold = dropout_threshold(dropout);
  p.keep_prob = dropout_keep_prob(p.dropout_threshold);
  p.rng = rng;
}

void check_lse(const AttentionProblem& p, const TensorView& lse, const char* name) {
  require_defined(lse, name, true);
  require_device(lse, name, p.device, p.q.device_index);
  require_dtype(lse, name, DType::kFloat32);
  require_contiguous(lse, name);
  if (p.format == Format::kTHD)
    require_shape(lse, name, {p.heads_q, p.total_q});
  else
    require_shape(lse, name, {p.batch, p.heads_q, p.max_seqlen_q});
}

void check_like(const AttentionProblem& p, const TensorView& t, const char* name,
                const TensorView& like, int64_t dim, const char* like_name, RowLayout& layout) {
  const bool key_side = like_name[0] != 'q';
  require_defined(t, name, true);
  require_device(t, name, p.device, p.q.device_index);
  require_dtype(t, name, p.dtype);
  require_same_layout_shape(t, like, dim, name, like_name);
  layout = row_layout(t, p.format);
  layout.seq_start = key_side ? p.k_rows.seq_start : p.q_rows.seq_start;
}

}  // namespace

void validate_config(const AttentionConfig& config) {
  require(std::isfinite(config.softcap) && config.softcap >= 0.0, "softcap",
          [&] { return "must be finite and >= 0 (0 disables it), got " + number(config.softcap); });
  require(config.softcap == 0.0 || in_representable_range(config.softcap), "softcap", [&] {
    return "must be 0 or within [" + number(kMinConfigMagnitude) + ", " +
           number(kMaxConfigMagnitude) + "] (the fp32 kernels' range), got " +
           number(config.softcap);
  });
  require(std::isfinite(config.dropout) && config.dropout >= 0.0 && config.dropout < 1.0, "dropout",
          [&] { return "must be in [0, 1), got " + std::to_string(config.dropout); });
  if (config.scale) {
    require(std::isfinite(*config.scale) && *config.scale > 0.0, "scale",
            [&] { return "must be finite and > 0, got " + number(*config.scale); });
    require(in_representable_range(*config.scale), "scale", [&] {
      return "must be within [" + number(kMinConfigMagnitude) + ", " + number(kMaxConfigMagnitude) +
             "] (the fp32 kernels' range), got " + number(*config.scale);
    });
  }
  require(config.window_left >= -1, "window_left",
          [&] { return "must be >= -1 (-1 is unbounded), got " + str(config.window_left); });
  require(config.window_right >= -1, "window_right",
          [&] { return "must be >= -1 (-1 is unbounded), got " + str(config.window_right); });
  if (mask_is_causal(config.mask_type))
    require(config.window_right <= 0, "window_right", [&] {
      return "must be 0 or -1 with causal mask " + std::string(to_string(config.mask_type)) +
             ", got " + str(config.window_right);
    });
  require(config.layer_number >= 0, "layer_number", "must be >= 0");
  // An enum value outside its name table (types.cc) is unknown: one rule, no bounds to keep.
  auto known = [](auto value) { return to_string(value) != "unknown"; };
  require(known(config.format), "format", "is not a known format");
  require(known(config.mask_type), "mask_type", "is not a known mask type");
  require(known(config.softmax_type), "softmax_type", "is not a known softmax type");
  require(known(config.bias_type), "bias_type", "is not a known bias type");
  require(known(config.flash_forward_kernel), "flash_forward_kernel",
          "is not a known kernel family");
  require(known(config.flash_backward_kernel), "flash_backward_kernel",
          "is not a known kernel family");
}

AttentionProblem build_forward_problem(const AttentionConfig& config, const ForwardArgs& args,
                                       double dropout, const RngState& rng) {
  AttentionProblem p = resolve(config, args.in, Pass::kForward, true, args.stream);
  set_dropout(p, dropout, rng);
  check_like(p, args.o, "o", p.q, p.head_dim_v, "q", p.o_rows);
  check_lse(p, args.lse, "lse");
  p.o = args.o;
  p.lse = args.lse;
  return p;
}

AttentionProblem build_backward_problem(const AttentionConfig& config, const BackwardArgs& args,
                                        double dropout) {
  AttentionProblem p = resolve(config, args.in, Pass::kBackward, true, args.stream);
  require(dropout == 0.0 || args.rng.has_value(), "rng",
          "the forward's RNG state is required in backward when dropout > 0");
  set_dropout(p, dropout, args.rng.value_or(RngState{}));
  check_like(p, args.o, "o", p.q, p.head_dim_v, "q", p.o_rows);
  check_like(p, args.d_o, "d_o", p.q, p.head_dim_v, "q", p.do_rows);
  check_like(p, args.dq, "dq", p.q, p.head_dim_qk, "q", p.dq_rows);
  check_like(p, args.dk, "dk", p.k, p.head_dim_qk, "k", p.dk_rows);
  check_like(p, args.dv, "dv", p.v, p.head_dim_v, "v", p.dv_rows);
  check_lse(p, args.lse, "lse");
  p.o = args.o;
  p.lse = args.lse;
  p.d_o = args.d_o;
  p.dq = args.dq;
  p.dk = args.dk;
  p.dv = args.dv;

  if (args.dbias.ndim > 0) {
    require(p.bias_type != BiasType::kNoBias, "dbias", "is requested but there is no bias");
    require_defined(args.dbias, "dbias", true);
    require_device(args.dbias, "dbias", p.device, p.q.device_index);
    require_dtype(args.dbias, "dbias", p.bias.dtype);
    require_contiguous(args.dbias, "dbias");
    bool same_shape = args.dbias.ndim == p.bias.ndim;
    for (int d = 0; same_shape && d < p.bias.ndim; ++d)
      same_shape = args.dbias.shape[d] == p.bias.shape[d];
    require(same_shape, "dbias", [&] {
      return "must have the shape of bias " + p.bias.shape_string() + ", got " +
             args.dbias.shape_string();
    });
    p.dbias = args.dbias;
    p.dbias_layout = broadcast_layout(args.dbias, "dbias", p.batch, p.heads_q, p.max_seqlen_q,
                                      p.max_seqlen_kv, true, false);
    p.wants_dbias = true;
  }
  if (args.dsoftmax_offset.ndim > 0) {
    require(p.softmax_type == SoftmaxType::kLearnable, "dsoftmax_offset",
            "is only produced with softmax_type learnable");
    require_defined(args.dsoftmax_offset, "dsoftmax_offset", true);
    require_device(args.dsoftmax_offset, "dsoftmax_offset", p.device, p.q.device_index);
    require_dtype(args.dsoftmax_offset, "dsoftmax_offset", DType::kFloat32);
    require_shape(args.dsoftmax_offset, "dsoftmax_offset", {p.heads_q});
    require_contiguous(args.dsoftmax_offset, "dsoftmax_offset");
    p.dsoftmax_offset = args.dsoftmax_offset;
    p.wants_dsoftmax_offset = true;
  }
  return p;
}

AttentionProblem build_explain_problem(const AttentionConfig& config, const AttentionInputs& in,
                                       Pass pass, bool wants_dbias, bool wants_dsoftmax_offset) {
  AttentionProblem p = resolve(config, in, pass, false, nullptr);
  set_dropout(p, config.dropout, RngState{});
  p.wants_dbias = wants_dbias && p.bias_type != BiasType::kNoBias;
  p.wants_dsoftmax_offset = wants_dsoftmax_offset && p.softmax_type == SoftmaxType::kLearnable;
  return p;
}

}  // namespace dpa
