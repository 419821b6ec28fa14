// `dpa cp-check`: runs context-parallel attention with in-process ranks on random inputs and
// prints the error of every output and gradient against the unsharded cpu_exact call.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <random>

#include "cli_args.h"
#include "cli_commands.h"
#include "cli_config.h"
#include "cli_errors.h"
#include "dpa/cp.h"

namespace dpa::cli {
namespace {

std::vector<FlagSpec> cp_check_flag_specs() {
  std::vector<FlagSpec> specs = {
      {"cp", "N", "number of in-process ranks (default 4)"},
      {"comm", "TYPE", "p2p (default), all_gather, a2a or a2a_p2p"},
      {"a2a-group", "A", "a2a_p2p: ranks per all-to-all group (default 2)"},
      {"reduce-dalpha", "", "return the CP-reduced dsoftmax_offset on every rank"},
      {"bias", "", "add a random [1, H, S, S] bias (type from --bias-type) and check dbias"},
      {"reduce-dbias", "", "return the CP-reduced dbias on every rank"},
      {"mask-density", "X", "--mask arbitrary: fraction of masked pairs (default 0.2)"},
      {"tolerance", "X",
       "largest rel_err that passes (default 1e-5: fp64 inputs, fp32 accumulation); above it, "
       "or NaN, the command exits 1"},
      {"batch", "B", "batch size (default 2)"},
      {"seqlen", "S", "sequence length, a multiple of 2*cp (default 128)"},
      {"heads", "H", "query heads (default 8)"},
      {"kv-heads", "G", "KV heads (default 2)"},
      {"head-dim", "D", "qk head dim (default 32)"},
      {"head-dim-v", "D", "v head dim (default: head-dim)"},
      {"sink-stddev", "X", "learnable sink offsets ~ X * randn (default 5)"},
      {"input-seed", "N", "seed of the random inputs (default 1)"},
  };
  for (const FlagSpec& spec : config_flag_specs()) specs.push_back(spec);
  return specs;
}

struct Buffer {
  std::vector<double> data;
  std::vector<int64_t> shape;
  TensorView view() {
    return TensorView::contiguous(data.data(), DType::kFloat64, shape.data(), int(shape.size()));
  }
};

Buffer make(std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return {std::vector<double>(size_t(n), 0.0), shape};
}

std::pair<double, double> errors(const std::vector<double>& got, const std::vector<double>& ref) {
  double diff = 0, norm = 0, worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = got[i] == ref[i] ? 0.0 : got[i] - ref[i];
    if (std::isnan(d)) return {INFINITY, INFINITY};
    worst = std::max(worst, std::fabs(d));
    diff += d * d;
    norm += std::isinf(ref[i]) ? 0.0 : ref[i] * ref[i];
  }
  return {worst, norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff)};
}

int run_cp_check(const std::vector<std::string>& words) {
  const std::vector<FlagSpec> specs = cp_check_flag_specs();
  ParsedArgs args = parse_args(specs, words);
  if (args.help_requested()) {
    std::cout << "usage: dpa cp-check [flags]\n\n" << format_flags(specs);
    return kExitOk;
  }
  const bool with_bias = args.has("bias");
  AttentionConfig config = parse_config(args, false, with_bias);
  if (config.format == Format::kTHD)
    throw UsageError("format", "--format: cp-check generates bshd or sbhd inputs");
  const int cp = int(args.get_int("cp").value_or(4));
  CpConfig cp_config;
  const std::string comm_name = args.get_or("comm", "p2p");
  std::optional<CpCommType> comm = parse_cp_comm_type(comm_name);
  if (!comm) throw UsageError("comm", "--comm: unknown comm type '" + comm_name + "'");
  cp_config.comm_type = *comm;
  cp_config.a2a_group_size = int(args.get_int("a2a-group").value_or(2));
  cp_config.reduce_dalpha = args.has("reduce-dalpha");
  cp_config.reduce_dbias = args.has("reduce-dbias");
  const int64_t b = args.get_int("batch").value_or(2), s = args.get_int("seqlen").value_or(128);
  const int64_t h = args.get_int("heads").value_or(8), g = args.get_int("kv-heads").value_or(2);
  const int64_t dqk = args.get_int("head-dim").value_or(32);
  const int64_t dv = args.get_int("head-dim-v").value_or(dqk);
  if (cp < 1) throw UsageError("cp", "--cp must be at least 1, got " + std::to_string(cp));
  if (s % (2 * cp) != 0) throw UsageError("seqlen", "--seqlen must be a multiple of 2 * --cp");
  const double density = args.get_double("mask-density").value_or(0.2);
  if (!(density >= 0.0 && density <= 1.0))
    throw UsageError("mask-density", "--mask-density must be in [0, 1]");
  const double tolerance = args.get_double("tolerance").value_or(1e-5);
  if (!(tolerance > 0.0)) throw UsageError("tolerance", "--tolerance must be > 0");
  const bool bshd = config.format == Format::kBSHD;
  auto shape = [&](int64_t seq, int64_t heads, int64_t dim) {
    return bshd ? std::vector<int64_t>{b, seq, heads, dim}
                : std::vector<int64_t>{seq, b, heads, dim};
  };

  std::mt19937_64 rng(uint64_t(args.get_int("input-seed").value_or(1)));
  std::normal_distribution<double> normal;
  auto random = [&](std::vector<int64_t> sh, double stddev = 1.0) {
    Buffer t = make(sh);
    for (double& x : t.data) x = stddev * normal(rng);
    return t;
  };
  Buffer q = random(shape(s, h, dqk)), k = random(shape(s, g, dqk)), v = random(shape(s, g, dv));
  Buffer d_o = random(shape(s, h, dv));
  std::vector<float> sink(static_cast<size_t>(h));
  const double sink_stddev = args.get_double("sink-stddev").value_or(5.0);
  for (float& x : sink) x = float(sink_stddev * normal(rng));
  const bool learnable = config.softmax_type == SoftmaxType::kLearnable;
  TensorView sink_view = TensorView::contiguous(sink.data(), DType::kFloat32, {h});
  const RngState rng_state = parse_rng(args);
  // Bias and arbitrary mask: unsharded tensors, the same on every rank (include/dpa/cp.h).
  Buffer bias = with_bias ? random({1, h, s, s}) : Buffer{};
  const bool arbitrary = config.mask_type == MaskType::kArbitrary;
  std::vector<uint8_t> mask(arbitrary ? size_t(b * h * s * s) : 0);
  std::bernoulli_distribution masked(density);
  for (uint8_t& m : mask) m = masked(rng) ? 1 : 0;
  auto add_aux = [&](AttentionInputs& in) {
    if (with_bias) in.bias = bias.view();
    if (arbitrary) in.attn_mask = TensorView::contiguous(mask.data(), DType::kBool, {b, h, s, s});
  };

  // The unsharded reference.
  struct Outputs {
    Buffer o, lse, dq, dk, dv;
    std::vector<float> dalpha;
    Buffer dbias;
  };
  auto outputs = [&] {
    Outputs out{make(shape(s, h, dv)),
                make({b, h, s}),
                make(q.shape),
                make(k.shape),
                make(v.shape),
                std::vector<float>(size_t(h), 0.0f),
                make(with_bias ? std::vector<int64_t>{1, h, s, s} : std::vector<int64_t>{0})};
    return out;
  };
  Outputs ref = outputs();
  std::vector<float> ref_lse(static_cast<size_t>(b * h * s));
  {
    AttentionConfig ref_config = config;
    ref_config.backend = BackendKind::kCpuExact;
    DotProductAttention attention(ref_config);
    ForwardArgs fwd;
    fwd.in.q = q.view();
    fwd.in.k = k.view();
    fwd.in.v = v.view();
    if (learnable) fwd.in.softmax_offset = sink_view;
    add_aux(fwd.in);
    fwd.o = ref.o.view();
    fwd.lse = TensorView::contiguous(ref_lse.data(), DType::kFloat32, {b, h, s});
    fwd.rng = rng_state;
    attention.forward(fwd);
    BackwardArgs bwd;
    bwd.in = fwd.in;
    bwd.o = fwd.o;
    bwd.lse = fwd.lse;
    bwd.d_o = d_o.view();
    bwd.dq = ref.dq.view();
    bwd.dk = ref.dk.view();
    bwd.dv = ref.dv.view();
    bwd.rng = rng_state;
    if (learnable)
      bwd.dsoftmax_offset = TensorView::contiguous(ref.dalpha.data(), DType::kFloat32, {h});
    if (with_bias) bwd.dbias = ref.dbias.view();
    attention.backward(bwd);
    for (size_t i = 0; i < ref_lse.size(); ++i) ref.lse.data[i] = ref_lse[i];
  }

  // The CP run: shard, run on `cp` threads, unshard.
  Outputs got = outputs();
  std::vector<float> dalpha_sum(size_t(h), 0.0f), dalpha_rank0(size_t(h), 0.0f);
  Buffer dbias_rank0 = got.dbias;  // got.dbias sums the ranks' partials
  std::vector<float> got_lse(static_cast<size_t>(b * h * s));
  std::mutex mutex;
  run_in_process(cp, [&](int rank, Communicator& communicator) {
    auto shard = [&](Buffer& full) {
      std::vector<int64_t> sh = full.shape;
      sh[bshd ? 1 : 0] /= cp;
      Buffer local = make(sh);
      shard_sequence(full.view(), local.view(), config.format, cp, rank);
      return local;
    };
    Buffer lq = shard(q), lk = shard(k), lv = shard(v), ldo = shard(d_o);
    Buffer lo = make(shape(s / cp, h, dv)), ldq = make(lq.shape), ldk = make(lk.shape),
           ldv = make(lv.shape);
    std::vector<float> lse(static_cast<size_t>(b * h * (s / cp))), dalpha(size_t(h), 0.0f);
    Buffer dbias = make(got.dbias.shape);
    TensorView lse_view = TensorView::contiguous(lse.data(), DType::kFloat32, {b, h, s / cp});
    ContextParallelAttention attention(config, cp_config, communicator);
    ForwardArgs fwd;
    fwd.in.q = lq.view();
    fwd.in.k = lk.view();
    fwd.in.v = lv.view();
    if (learnable) fwd.in.softmax_offset = sink_view;
    add_aux(fwd.in);
    fwd.o = lo.view();
    fwd.lse = lse_view;
    fwd.rng = rng_state;
    attention.forward(fwd);
    BackwardArgs bwd;
    bwd.in = fwd.in;
    bwd.o = fwd.o;
    bwd.lse = lse_view;
    bwd.d_o = ldo.view();
    bwd.dq = ldq.view();
    bwd.dk = ldk.view();
    bwd.dv = ldv.view();
    bwd.rng = rng_state;
    if (learnable)
      bwd.dsoftmax_offset = TensorView::contiguous(dalpha.data(), DType::kFloat32, {h});
    if (with_bias) bwd.dbias = dbias.view();
    attention.backward(bwd);
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t i = 0; i < dbias.data.size(); ++i) got.dbias.data[i] += dbias.data[i];
    if (rank == 0) dbias_rank0 = dbias;
    unshard_sequence(lo.view(), got.o.view(), config.format, cp, rank);
    unshard_sequence(ldq.view(), got.dq.view(), config.format, cp, rank);
    unshard_sequence(ldk.view(), got.dk.view(), config.format, cp, rank);
    unshard_sequence(ldv.view(), got.dv.view(), config.format, cp, rank);
    unshard_lse(lse_view, TensorView::contiguous(got_lse.data(), DType::kFloat32, {b, h, s}),
                config.format, cp, rank);
    for (int64_t i = 0; i < h; ++i) dalpha_sum[size_t(i)] += dalpha[size_t(i)];
    if (rank == 0) dalpha_rank0 = dalpha;
  });
  for (size_t i = 0; i < got_lse.size(); ++i) got.lse.data[i] = got_lse[i];

  std::printf("cp-check: cp=%d comm=%s%s%s  b=%lld s=%lld H=%lld G=%lld d=%lld/%lld\n", cp,
              std::string(to_string(cp_config.comm_type)).c_str(),
              cp_config.reduce_dalpha ? " reduce_dalpha" : "",
              cp_config.reduce_dbias ? " reduce_dbias" : "", (long long)b, (long long)s,
              (long long)h, (long long)g, (long long)dqk, (long long)dv);
  std::printf("%-18s %14s %14s\n", "output", "max_abs_err", "rel_err");
  // A check that can fail: every row is held to the tolerance, NaN (reported as inf) fails.
  std::vector<std::string> failed;
  auto row = [&](const char* name, std::pair<double, double> e) {
    std::printf("%-18s %14.3e %14.3e\n", name, e.first, e.second);
    if (!(e.second <= tolerance)) failed.push_back(name);
  };
  row("o", errors(got.o.data, ref.o.data));
  row("lse", errors(got.lse.data, ref.lse.data));
  row("dq", errors(got.dq.data, ref.dq.data));
  row("dk", errors(got.dk.data, ref.dk.data));
  row("dv", errors(got.dv.data, ref.dv.data));
  if (learnable) {
    std::vector<double> ref_dalpha(ref.dalpha.begin(), ref.dalpha.end());
    const std::vector<float>& mine = cp_config.reduce_dalpha ? dalpha_rank0 : dalpha_sum;
    row(cp_config.reduce_dalpha ? "dalpha (rank 0)" : "dalpha (sum)",
        errors(std::vector<double>(mine.begin(), mine.end()), ref_dalpha));
  }
  if (with_bias)
    row(cp_config.reduce_dbias ? "dbias (rank 0)" : "dbias (sum)",
        errors(cp_config.reduce_dbias ? dbias_rank0.data : got.dbias.data, ref.dbias.data));
  if (!failed.empty()) {
    std::string names;
    for (const std::string& name : failed) names += (names.empty() ? "" : ", ") + name;
    std::fprintf(stderr, "dpa cp-check: rel_err above --tolerance %g in: %s\n", tolerance,
                 names.c_str());
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

int cp_check_command(const std::vector<std::string>& words) {
  return run_guarded("cp-check", cp_check_flag, [&] { return run_cp_check(words); });
}

}  // namespace dpa::cli
