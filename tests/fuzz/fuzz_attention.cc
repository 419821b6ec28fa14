// libFuzzer harness for DotProductAttention on the host backends (dpa/attention.h): the bytes
// choose the layout (bshd, sbhd, thd with or without padded offsets), the shapes (GQA or not,
// empty batches and sequences, head counts that do not divide), every table entry (valid
// lengths or arbitrary bytes), every feature (masks, windows and their diagonal, softcap, scale,
// sinks, biases broadcast any way or of a wrong shape, ALiBi, arbitrary masks, dropout,
// deterministic mode) and which outputs alias the inputs. Every tensor is allocated as large as
// its view says, so a read or write the validation let through is an ASan report.
//
// A finding is: a crash, a sanitizer report or another exception than dpa::Error; an error after
// which an output was written; a call that accepted an input its config does not use (a bias
// without a bias type, sink offsets without learnable sinks, a mask without mask type
// arbitrary) or a workspace block over an input's bytes; or a result of the cpu backend that
// differs from cpu_exact's on the same inputs (forward and backward). scripts/fuzz.sh runs it.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "dpa/attention.h"
#include "fuzz_input.h"

namespace {

using dpa::AttentionConfig;
using dpa::BackendKind;
using dpa::DType;
using dpa::TensorView;
using dpa::fuzz::boundaries;
using dpa::fuzz::Bytes;
using dpa::fuzz::floats;
using dpa::fuzz::Tensor;

constexpr float kSentinel = 1234.5f;

void finding(const char* what) {
  std::fprintf(stderr, "fuzz_attention: %s\n", what);
  std::abort();
}

// Now and then a strided layout with gaps (fuzz_input.h's floats): a dimension other than the
// last steps over 1 to 3 more elements.
struct Layout {
  int pad_dim = -1;
  int64_t pad = 0;
};
Layout layout(size_t ndim, Bytes& bytes) {
  if (ndim < 2 || bytes.below(4) != 0) return {};
  return {int(bytes.below(int64_t(ndim) - 1)), 1 + bytes.below(3)};
}

double element(const TensorView& t, int64_t flat) {
  const int64_t at = dpa::fuzz::offset_of(t, flat);
  return t.dtype == DType::kFloat64 ? static_cast<const double*>(t.data)[at]
                                    : double(static_cast<const float*>(t.data)[at]);
}

// Inputs of a few magnitudes: sin over the elements, from a phase the bytes choose; a layout's
// gaps hold NaN, which reaches a result only if a backend reads outside the view.
Tensor values(std::vector<int64_t> shape, DType dtype, Bytes& bytes) {
  const Layout l = layout(shape.size(), bytes);
  Tensor t = floats(shape, NAN, dtype, l.pad_dim, l.pad);
  const double phase = double(bytes.next()), magnitude = bytes.below(4) == 0 ? 6.0 : 1.5;
  for (int64_t i = 0; i < t.view.numel(); ++i) {
    const double value = magnitude * std::sin(0.61 * double(i) + phase);
    const int64_t at = dpa::fuzz::offset_of(t.view, i);
    if (dtype == DType::kFloat64)
      t.doubles[size_t(at)] = value;
    else
      t.floats[size_t(at)] = float(value);
  }
  return t;
}

// An extent, now and then off by one (the validation must name it).
int64_t maybe_wrong(int64_t extent, Bytes& bytes) {
  return bytes.below(16) == 0 ? extent + 1 : extent;
}

std::vector<int64_t> shape_of(const TensorView& t) {
  return std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim);
}

bool sentinel(const Tensor& t, int64_t at) {
  return t.view.dtype == DType::kFloat64 ? t.doubles[size_t(at)] == double(kSentinel)
                                         : t.floats[size_t(at)] == kSentinel;
}

// Every element of the buffer, the view's and its gaps', still the sentinel.
bool untouched(const Tensor& t) {
  const size_t n = t.view.dtype == DType::kFloat64 ? t.doubles.size() : t.floats.size();
  for (size_t at = 0; at < n; ++at)
    if (!sentinel(t, int64_t(at))) return false;
  return true;
}

// The gaps between the view's elements still the sentinel: a backend wrote only its output.
bool gaps_untouched(const Tensor& t) {
  if (!t.view.defined()) return true;  // a gradient not asked for
  const size_t n = t.view.dtype == DType::kFloat64 ? t.doubles.size() : t.floats.size();
  std::vector<bool> covered(n, false);
  for (int64_t i = 0; i < t.view.numel(); ++i)
    covered[size_t(dpa::fuzz::offset_of(t.view, i))] = true;
  for (size_t at = 0; at < n; ++at)
    if (!covered[at] && !sentinel(t, int64_t(at))) return false;
  return true;
}

// cpu against cpu_exact: equal infinities, no NaN (the inputs are finite, so a NaN is a read of
// a gap or a fault), else within a relative tolerance that covers fp32 arithmetic over the few
// keys the shapes allow.
bool close(const Tensor& got, const Tensor& want) {
  const int64_t n = got.view.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double a = element(got.view, i), b = element(want.view, i);
    if (std::isnan(a) || std::isnan(b)) return false;
    if (std::isinf(a) || std::isinf(b)) {
      if (a != b) return false;
    } else if (std::fabs(a - b) > 2e-3 * (1.0 + std::fabs(b))) {
      return false;
    }
  }
  return true;
}

struct Call {
  AttentionConfig config;
  dpa::AttentionInputs in;
  std::vector<Tensor> keep;  // every input's storage
  std::vector<int64_t> q_shape, k_shape, v_shape, o_shape, lse_shape;
  DType dtype = DType::kFloat32;

  TensorView add(Tensor t) {
    keep.push_back(std::move(t));
    return keep.back().view;
  }
};

// The config and every input, from the bytes.
Call draw_call(Bytes& bytes) {
  Call c;
  AttentionConfig& config = c.config;
  config.format = dpa::Format(bytes.below(3));
  config.mask_type = dpa::MaskType(bytes.below(8));  // 7: unknown
  config.window_left = bytes.below(6) - 1;
  config.window_right = bytes.below(5) - 1;
  config.bottom_right_diagonal = bytes.below(2);
  const double caps[] = {0.0, 0.0, 2.0, 30.0, -1.0, NAN};
  config.softcap = caps[bytes.below(6)];
  const int64_t scale = bytes.below(6);
  if (scale == 0) config.scale = 0.5;
  if (scale == 1) config.scale = -1.0;
  config.softmax_type = dpa::SoftmaxType(bytes.below(7) == 0 ? 3 : bytes.below(3));
  config.bias_type = dpa::BiasType(bytes.below(3));
  const double dropouts[] = {0.0, 0.0, 0.0, 0.25, 1.0};
  config.dropout = dropouts[bytes.below(5)];
  config.seed = bytes.next();
  config.deterministic = bytes.below(2);
  config.backend = bytes.below(2) ? BackendKind::kCpu : BackendKind::kCpuExact;
  c.dtype = bytes.below(4) == 0 ? DType::kFloat64 : DType::kFloat32;

  const int64_t G = 1 + bytes.below(2), H = G * (1 + bytes.below(2)) + (bytes.below(8) == 0);
  const int64_t d = 1 + bytes.below(4), dv = 1 + bytes.below(4);
  int64_t b = bytes.below(3), sq = bytes.below(5), skv = bytes.below(6);
  if (config.format == dpa::Format::kTHD) {
    c.in.cu_seqlens_q = c.add(boundaries(b, bytes, &sq));
    c.in.cu_seqlens_kv = c.add(boundaries(b, bytes, &skv));
    if (bytes.below(3) == 0) {  // padded offsets: a slot of the length or more, or anything
      int64_t padded_q = 0, padded_kv = 0;
      c.in.cu_seqlens_q_padded = c.add(boundaries(b, bytes, &padded_q));
      c.in.cu_seqlens_kv_padded = c.add(boundaries(b, bytes, &padded_kv));
      sq += padded_q;
      skv += padded_kv;
    }
    c.q_shape = {sq, H, d};
    c.k_shape = {skv, G, d};
    c.v_shape = {skv, G, dv};
    c.o_shape = {sq, H, dv};
    c.lse_shape = {H, sq};
  } else {
    if (bytes.below(3) == 0) {  // per-sequence lengths
      int64_t unused = 0;
      c.in.cu_seqlens_q = c.add(boundaries(b, bytes, &unused));
      c.in.cu_seqlens_kv = c.add(boundaries(b, bytes, &unused));
    }
    const bool sbhd = config.format == dpa::Format::kSBHD;
    auto rows = [&](int64_t s, int64_t heads, int64_t dim) {
      return sbhd ? std::vector<int64_t>{s, b, heads, dim} : std::vector<int64_t>{b, s, heads, dim};
    };
    c.q_shape = rows(sq, H, d);
    c.k_shape = rows(skv, G, d);
    c.v_shape = rows(skv, G, maybe_wrong(dv, bytes));
    c.o_shape = rows(sq, H, dv);
    c.lse_shape = {b, H, sq};
  }
  c.in.q = c.add(values(c.q_shape, c.dtype, bytes));
  c.in.k = c.add(values(c.k_shape, c.dtype, bytes));
  c.in.v = c.add(values(c.v_shape, c.dtype, bytes));

  const int64_t bias_rows = config.format == dpa::Format::kTHD ? 1 : sq;
  if (config.bias_type != dpa::BiasType::kNoBias || bytes.below(16) == 0)
    c.in.bias = c.add(values({bytes.below(2) ? b : 1, bytes.below(2) ? H : 1,
                              bytes.below(2) ? bias_rows : 1, maybe_wrong(skv, bytes)},
                             c.dtype, bytes));
  const int64_t alibi = bytes.below(4);
  if (alibi == 1)
    c.in.alibi_slopes = c.add(values({maybe_wrong(H, bytes)}, DType::kFloat32, bytes));
  if (alibi == 2) c.in.alibi_slopes = c.add(values({b, H}, DType::kFloat32, bytes));
  if (config.softmax_type == dpa::SoftmaxType::kLearnable || bytes.below(16) == 0)
    c.in.softmax_offset = c.add(values({maybe_wrong(H, bytes)}, DType::kFloat32, bytes));
  if (config.mask_type == dpa::MaskType::kArbitrary || bytes.below(16) == 0) {
    Tensor mask;
    const std::vector<int64_t> shape = {bytes.below(2) ? b : 1, bytes.below(2) ? H : 1, bias_rows,
                                        skv};
    for (int64_t i = 0; i < dpa::fuzz::element_count(shape); ++i)
      mask.bools.push_back(bytes.below(3) == 0);
    mask.view = TensorView::contiguous(mask.bools.data(), DType::kBool, shape.data(), 4);
    c.in.attn_mask = c.add(std::move(mask));
  }
  return c;
}

// An optional input that the config does not use: a call that accepts it has dropped it.
const char* unused_input(const Call& c) {
  if (c.in.bias.defined() && c.config.bias_type == dpa::BiasType::kNoBias) return "bias";
  if (c.in.softmax_offset.defined() && c.config.softmax_type != dpa::SoftmaxType::kLearnable)
    return "softmax_offset";
  if (c.in.attn_mask.defined() && c.config.mask_type != dpa::MaskType::kArbitrary)
    return "attn_mask";
  return nullptr;
}

// An output of the call, all sentinels; now and then aliased to an input instead (the call
// must refuse the provable cases and write nothing).
Tensor output(std::vector<int64_t> shape, DType dtype, Layout l = {}) {
  return floats(shape, kSentinel, dtype, l.pad_dim, l.pad);
}

TensorView maybe_aliased(const Tensor& out, const Call& c, Bytes& bytes) {
  if (bytes.below(24) != 0 || c.keep.empty()) return out.view;
  TensorView aliased = out.view;
  aliased.data = c.keep[size_t(bytes.below(int64_t(c.keep.size())))].view.data;
  return aliased;
}

// Now and then a caller's workspace block on the 256-byte boundary a workspace needs, inside the
// bytes of an input of 256 bytes or more: the call may write all of the block, so it must refuse.
dpa::Workspace maybe_overlapping_workspace(const Call& c, Bytes& bytes) {
  if (bytes.below(16) != 0 || c.keep.empty()) return {};
  const Tensor& t = c.keep[size_t(bytes.below(int64_t(c.keep.size())))];
  const size_t size = t.floats.size() * sizeof(float) + t.doubles.size() * sizeof(double) +
                      t.ints.size() * sizeof(int32_t) + t.bools.size();
  if (size < 256) return {};
  dpa::Workspace workspace;
  const auto at = reinterpret_cast<uintptr_t>(t.view.data);
  workspace.data = reinterpret_cast<void*>((at + 255) & ~uintptr_t(255));
  workspace.bytes = 256;
  return workspace;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes bytes(data, size);
  Call c = draw_call(bytes);
  Tensor o = output(c.o_shape, c.dtype, layout(c.o_shape.size(), bytes));
  Tensor lse = output(c.lse_shape, DType::kFloat32);
  dpa::ForwardArgs forward;
  forward.in = c.in;
  forward.o = maybe_aliased(o, c, bytes);
  forward.lse = lse.view;
  const bool aliased = forward.o.data != o.view.data;
  forward.workspace = maybe_overlapping_workspace(c, bytes);
  if (bytes.below(8) == 0) forward.dropout = bytes.below(2) ? 0.0 : 1.5;

  dpa::ForwardResult result;
  try {
    dpa::DotProductAttention attention(c.config);
    result = attention.forward(forward);
  } catch (const dpa::Error&) {
    if (!untouched(o) || !untouched(lse)) finding("forward wrote an output, then threw");
    return 0;
  }
  if (forward.workspace.data != nullptr) finding("forward took a workspace over an input");
  if (const char* dropped = unused_input(c)) {
    std::fprintf(stderr, "fuzz_attention: unused %s\n", dropped);
    finding("forward accepted an input its config does not use");
  }
  if (aliased) return 0;  // a call on undecided aliasing is the caller's contract
  if (!gaps_untouched(o)) finding("forward wrote between o's elements");
  const bool differential = c.config.backend == BackendKind::kCpu;
  AttentionConfig exact = c.config;
  exact.backend = BackendKind::kCpuExact;
  if (differential) {
    Tensor o_exact = output(c.o_shape, c.dtype), lse_exact = output(c.lse_shape, DType::kFloat32);
    dpa::ForwardArgs reference = forward;
    reference.o = o_exact.view;
    reference.lse = lse_exact.view;
    reference.rng = result.rng;
    dpa::DotProductAttention(exact).forward(reference);
    if (!close(o, o_exact) || !close(lse, lse_exact))
      finding("cpu's forward differs from cpu_exact");
  }
  if (bytes.below(2) == 0) return 0;

  Tensor d_o = values(c.o_shape, c.dtype, bytes);
  Tensor dq = output(c.q_shape, c.dtype, layout(c.q_shape.size(), bytes));
  Tensor dk = output(c.k_shape, c.dtype, layout(c.k_shape.size(), bytes));
  Tensor dv = output(c.v_shape, c.dtype, layout(c.v_shape.size(), bytes));
  dpa::BackwardArgs backward = dpa::backward_args_for(forward, result, d_o.view, dq.view,
                                                      maybe_aliased(dk, c, bytes), dv.view);
  Tensor dbias, dsoftmax_offset;
  if (c.in.bias.defined() && bytes.below(2)) {
    dbias = output(shape_of(c.in.bias), c.dtype);
    backward.dbias = dbias.view;
  }
  if (c.in.softmax_offset.defined() && bytes.below(2)) {
    dsoftmax_offset = output({c.in.softmax_offset.shape[0]}, DType::kFloat32);
    backward.dsoftmax_offset = dsoftmax_offset.view;
  }
  try {
    dpa::DotProductAttention(c.config).backward(backward);
  } catch (const dpa::Error&) {
    for (const Tensor* t : {&dq, &dk, &dv, &dbias, &dsoftmax_offset})
      if (!untouched(*t)) finding("backward wrote a gradient, then threw");
    return 0;
  }
  if (backward.dk.data != dk.view.data) return 0;  // aliased: the caller's contract
  for (const Tensor* t : {&dq, &dk, &dv, &dbias, &dsoftmax_offset})
    if (!gaps_untouched(*t)) finding("backward wrote between a gradient's elements");
  if (!differential) return 0;
  // The same backward on cpu_exact, every requested gradient into tensors of its own.
  dpa::BackwardArgs reference = backward;
  std::vector<std::pair<const Tensor*, Tensor>> pairs;
  for (auto [got, view] :
       {std::make_pair(&dq, &reference.dq), std::make_pair(&dk, &reference.dk),
        std::make_pair(&dv, &reference.dv), std::make_pair(&dbias, &reference.dbias),
        std::make_pair(&dsoftmax_offset, &reference.dsoftmax_offset)}) {
    if (!got->view.defined()) continue;
    pairs.emplace_back(got, output(shape_of(got->view), got->view.dtype));
    *view = pairs.back().second.view;
  }
  dpa::DotProductAttention(exact).backward(reference);
  for (const auto& [got, want] : pairs)
    if (!close(*got, want)) finding("cpu's backward differs from cpu_exact");
  return 0;
}
