// The dpa command-line tool, run as a separate process (DPA_CLI_PATH): outputs match calling
// the library directly, bad input exits non-zero naming the flag and writes nothing, explain
// lists every backend, and the demo runs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "npy.h"
#include "support/attention_case.h"

namespace dpa::test {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("dpa_cli_") + (info ? info->name() : "test") + "_" +
                       std::to_string(::getpid()) + "_" + std::to_string(counter++);
    for (char& c : name)
      if (c == '/') c = '_';
    path_ = fs::temp_directory_path() / name;
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

struct CliResult {
  int status = -1;
  std::string out, err;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

CliResult run_cli(const std::string& args, const ScratchDir& scratch) {
  const std::string out = scratch.file("stdout.txt"), err = scratch.file("stderr.txt");
  // The library's environment switches would change what these tests expect.
  const std::string command = std::string("env -u DPA_BACKEND -u DPA_LOG '") + DPA_CLI_PATH + "' " +
                              args + " >'" + out + "' 2>'" + err + "'";
  int raw = std::system(command.c_str());
  CliResult result;
  result.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  result.out = read_text(out);
  result.err = read_text(err);
  return result;
}

std::string save(const ScratchDir& scratch, const std::string& name, const HostTensor& tensor) {
  const std::string path = scratch.file(name);
  npy::save(path, npy::Array::from_view(tensor.view()));
  return path;
}

// The flags that reproduce spec.config (and run_case's RNG state {seed, 7}).
std::string config_flags(const CaseSpec& spec) {
  const AttentionConfig& c = spec.config;
  std::ostringstream flags;
  flags.precision(17);
  flags << " --format " << to_string(c.format) << " --mask " << to_string(c.mask_type);
  flags << " --window " << c.window_left << "," << c.window_right;
  flags << " --bottom-right-diagonal " << (c.bottom_right_diagonal ? 1 : 0);
  flags << " --softcap " << c.softcap << " --softmax-type " << to_string(c.softmax_type);
  if (c.scale) flags << " --scale " << *c.scale;
  if (c.bias_type != BiasType::kNoBias) flags << " --bias-type " << to_string(c.bias_type);
  flags << " --dropout " << c.dropout << " --seed " << c.seed << " --offset 7";
  if (c.layer_number) flags << " --layer-number " << c.layer_number;
  return flags.str();
}

// Writes every input of the case and returns the tensor flags.
std::string input_flags(const ScratchDir& scratch, const CaseTensors& t, bool with_do) {
  std::string flags = " --q " + save(scratch, "q.npy", t.q) + " --k " +
                      save(scratch, "k.npy", t.k) + " --v " + save(scratch, "v.npy", t.v);
  if (with_do) flags += " --do " + save(scratch, "do.npy", t.d_o);
  auto optional = [&](const HostTensor& tensor, const char* flag, const char* file) {
    if (tensor.defined()) flags += std::string(" --") + flag + " " + save(scratch, file, tensor);
  };
  optional(t.cu_seqlens_q, "cu-seqlens-q", "cu_q.npy");
  optional(t.cu_seqlens_kv, "cu-seqlens-kv", "cu_kv.npy");
  optional(t.cu_seqlens_q_padded, "cu-seqlens-q-padded", "cu_q_padded.npy");
  optional(t.cu_seqlens_kv_padded, "cu-seqlens-kv-padded", "cu_kv_padded.npy");
  optional(t.bias, "bias", "bias.npy");
  optional(t.alibi_slopes, "alibi-slopes", "alibi.npy");
  optional(t.softmax_offset, "softmax-offset", "offset.npy");
  optional(t.attn_mask, "attn-mask", "mask.npy");
  return flags;
}

// Loads DIR/name and checks its dtype and shape against the library's output.
HostTensor load_output(const fs::path& dir, const std::string& name, const HostTensor& expected) {
  npy::Array array = npy::load((dir / name).string());
  EXPECT_EQ(array.dtype, expected.dtype()) << name;
  EXPECT_EQ(array.shape, expected.shape()) << name;
  HostTensor tensor(array.dtype, array.shape);
  std::copy(array.bytes.begin(), array.bytes.end(),
            static_cast<unsigned char*>(tensor.view().data));
  return tensor;
}

// Runs `spec` through the CLI and through the library, and compares every output file.
// With backend cpu_exact on both sides the results must agree to the last bit.
void expect_cli_matches_library(const CaseSpec& spec, const std::string& cli_backend,
                                double tolerance, bool backward = true) {
  ScratchDir scratch;
  CaseTensors t = make_case(spec);
  const fs::path out = scratch.path() / "out";
  CliResult r = run_cli("attention" + input_flags(scratch, t, backward) + config_flags(spec) +
                            " --backend " + cli_backend + " --out " + out.string(),
                        scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  CaseOutputs reference = run_case(spec, t, BackendKind::kCpuExact, backward);

  EXPECT_LE(relative_error(load_output(out, "o.npy", reference.o), reference.o), tolerance);
  EXPECT_LE(relative_error(load_output(out, "lse.npy", reference.lse), reference.lse), tolerance);
  std::set<std::string> expected_files = {"o.npy", "lse.npy"};
  if (backward) {
    EXPECT_LE(relative_error(load_output(out, "dq.npy", reference.dq), reference.dq), tolerance);
    EXPECT_LE(relative_error(load_output(out, "dk.npy", reference.dk), reference.dk), tolerance);
    EXPECT_LE(relative_error(load_output(out, "dv.npy", reference.dv), reference.dv), tolerance);
    expected_files.insert({"dq.npy", "dk.npy", "dv.npy"});
    if (reference.dbias.defined()) {
      EXPECT_LE(relative_error(load_output(out, "dbias.npy", reference.dbias), reference.dbias),
                tolerance);
      expected_files.insert("dbias.npy");
    }
    if (reference.dsoftmax_offset.defined()) {
      EXPECT_LE(relative_error(load_output(out, "dsoftmax_offset.npy", reference.dsoftmax_offset),
                               reference.dsoftmax_offset),
                tolerance);
      expected_files.insert("dsoftmax_offset.npy");
    }
  }
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(out)) files.insert(entry.path().filename());
  EXPECT_EQ(files, expected_files);
}

TEST(Cli, ForwardMatchesLibraryBitForBit) {
  CaseSpec spec;
  spec.config.mask_type = MaskType::kCausal;
  spec.config.softcap = 2.0;
  spec.heads_q = 4;
  spec.heads_kv = 2;
  spec.seqlen_q = 9;
  spec.seqlen_kv = 9;
  expect_cli_matches_library(spec, "cpu_exact", 0.0, /*backward=*/false);
}

TEST(Cli, GradientsIncludingBiasAndSinkMatchLibrary) {
  CaseSpec spec;
  spec.config.mask_type = MaskType::kCausalBottomRight;
  spec.config.window_left = 3;
  spec.config.window_right = 0;
  spec.config.softcap = 1.5;
  spec.config.scale = 0.7;
  spec.config.softmax_type = SoftmaxType::kLearnable;
  spec.config.bias_type = BiasType::kPostScale;
  spec.bias_shape = {1, 4, 1, 7};  // broadcast over batch and queries: dbias sums over them
  spec.heads_q = 4;
  spec.heads_kv = 1;
  expect_cli_matches_library(spec, "cpu_exact", 0.0);
}

TEST(Cli, DropoutIsBitExactWithSeedAndOffset) {
  CaseSpec spec;
  spec.config.dropout = 0.3;
  spec.config.seed = 123456789;
  spec.config.bias_type = BiasType::kPreScale;
  spec.config.softmax_type = SoftmaxType::kOffByOne;
  expect_cli_matches_library(spec, "cpu_exact", 0.0);
}

TEST(Cli, DefaultBackendFloat32AndSbhd) {
  CaseSpec spec;
  spec.dtype = DType::kFloat32;
  spec.config.format = Format::kSBHD;
  spec.config.mask_type = MaskType::kPaddingCausal;
  spec.lengths_q = {5, 3};
  spec.lengths_kv = {7, 2};
  spec.seqlen_q = 5;
  spec.seqlen_kv = 7;
  spec.alibi = true;
  expect_cli_matches_library(spec, "auto", 1e-5);
}

TEST(Cli, ThdWithGapsAndArbitraryMask) {
  CaseSpec thd;
  thd.config.format = Format::kTHD;
  thd.config.mask_type = MaskType::kPaddingCausalBottomRight;
  thd.lengths_q = {3, 0, 6};
  thd.lengths_kv = {5, 2, 6};
  thd.gaps_q = {1, 2, 0};
  thd.gaps_kv = {0, 3, 1};
  thd.config.softmax_type = SoftmaxType::kLearnable;
  expect_cli_matches_library(thd, "cpu_exact", 0.0);

  CaseSpec masked;
  masked.config.mask_type = MaskType::kArbitrary;
  expect_cli_matches_library(masked, "cpu_exact", 0.0);
}

TEST(Cli, Float16InputsGiveFloat16Outputs) {
  CaseSpec spec;
  spec.dtype = DType::kFloat16;
  spec.config.mask_type = MaskType::kCausal;
  spec.config.softcap = 3.0;
  spec.heads_q = 2;
  spec.heads_kv = 2;
  // Both sides store fp16; only accumulation order differs.
  expect_cli_matches_library(spec, "auto", 2e-3);
}

TEST(Cli, ConvertsFloat64SinkOffsets) {
  ScratchDir scratch;
  CaseSpec spec;
  spec.config.softmax_type = SoftmaxType::kLearnable;
  CaseTensors t = make_case(spec);
  HostTensor offset64(DType::kFloat64, t.softmax_offset.shape());
  for (int64_t i = 0; i < offset64.numel(); ++i) offset64.set(i, t.softmax_offset.get(i));
  std::string flags = " --q " + save(scratch, "q.npy", t.q) + " --k " +
                      save(scratch, "k.npy", t.k) + " --v " + save(scratch, "v.npy", t.v) +
                      " --do " + save(scratch, "do.npy", t.d_o) + " --softmax-offset " +
                      save(scratch, "offset.npy", offset64);  // no --softmax-type: learnable
  const fs::path out = scratch.path() / "out";
  CliResult r =
      run_cli("attention --backend cpu_exact" + flags + " --out " + out.string(), scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  CaseOutputs reference = run_case(spec, t, BackendKind::kCpuExact);
  EXPECT_EQ(relative_error(load_output(out, "o.npy", reference.o), reference.o), 0.0);
  EXPECT_EQ(relative_error(load_output(out, "dsoftmax_offset.npy", reference.dsoftmax_offset),
                           reference.dsoftmax_offset),
            0.0);
}

// Bad input: a non-zero exit, the flag named on stderr, nothing on stdout, nothing in DIR.
struct BadCli {
  std::string name;
  std::string flags;     // replaces or adds to the good flags; {q} {k} ... are input paths
  std::string expected;  // must appear on stderr
  int status = 2;
};

void PrintTo(const BadCli& bad, std::ostream* os) { *os << bad.name; }

class CliBadInput : public ::testing::TestWithParam<BadCli> {};

TEST_P(CliBadInput, ExitsNamingTheFlagAndWritesNothing) {
  const BadCli& bad = GetParam();
  ScratchDir scratch;
  CaseSpec spec;  // H = 4, G = 2, b = 2, sq = 5, skv = 7
  spec.config.softmax_type = SoftmaxType::kLearnable;
  CaseTensors t = make_case(spec);
  std::map<std::string, std::string> paths = {
      {"{q}", save(scratch, "q.npy", t.q)},
      {"{k}", save(scratch, "k.npy", t.k)},
      {"{v}", save(scratch, "v.npy", t.v)},
      {"{do}", save(scratch, "do.npy", t.d_o)},
      {"{offset}", save(scratch, "offset.npy", t.softmax_offset)},
      {"{offset5}", save(scratch, "offset5.npy", HostTensor(DType::kFloat32, {5}))},
      {"{k3}", save(scratch, "k3.npy", HostTensor(DType::kFloat64, {2, 7, 3, 8}))},
      {"{cu_bad}",
       save(scratch, "cu_bad.npy", HostTensor::from_values(DType::kInt32, {3}, {0, 6, 4}))},
      {"{mask_f}", save(scratch, "mask_f.npy", HostTensor(DType::kFloat32, {1, 1, 5, 7}))},
      {"{q_bool}", save(scratch, "q_bool.npy", HostTensor(DType::kBool, {2, 5, 4, 8}))},
      {"{missing}", scratch.file("missing.npy")},
      {"{alibi_nan}",
       save(scratch, "alibi_nan.npy",
            HostTensor::from_values(DType::kFloat32, {4}, {0.5, std::nan(""), 0.25, 0.125}))},
      {"{scalar}", save(scratch, "scalar.npy", HostTensor(DType::kFloat32, {}))},
      {"{directory}", (fs::create_directories(scratch.path() / "a_dir"), scratch.file("a_dir"))},
      {"{text}",
       (std::ofstream(scratch.file("text.npy")) << "not an npy file", scratch.file("text.npy"))},
      {"{q_int}", save(scratch, "q_int.npy", HostTensor(DType::kInt32, {2, 5, 4, 8}))},
      {"{q_3d}", save(scratch, "q_3d.npy", HostTensor(DType::kFloat64, {2, 5, 32}))},
      {"{q_6d}",
       (npy::save(scratch.file("q_6d.npy"), npy::Array(DType::kFloat64, {1, 2, 5, 4, 8, 1})),
        scratch.file("q_6d.npy"))},
      {"{k_f32}", save(scratch, "k_f32.npy", HostTensor(DType::kFloat32, {2, 7, 2, 8}))},
      {"{k_d4}", save(scratch, "k_d4.npy", HostTensor(DType::kFloat64, {2, 7, 2, 4}))},
      {"{k_b1}", save(scratch, "k_b1.npy", HostTensor(DType::kFloat64, {1, 7, 2, 8}))},
      {"{v_s6}", save(scratch, "v_s6.npy", HostTensor(DType::kFloat64, {2, 6, 2, 8}))},
      {"{do_bad}", save(scratch, "do_bad.npy", HostTensor(DType::kFloat64, {2, 5, 4, 4}))},
      {"{cu_len}",
       save(scratch, "cu_len.npy", HostTensor::from_values(DType::kInt32, {2}, {0, 5}))},
      {"{cu_float}",
       save(scratch, "cu_float.npy", HostTensor::from_values(DType::kFloat32, {3}, {0, 5, 10}))},
      {"{cu_big}",
       save(scratch, "cu_big.npy", HostTensor::from_values(DType::kInt32, {3}, {0, 5, 99}))},
      {"{cu_start}",
       save(scratch, "cu_start.npy", HostTensor::from_values(DType::kInt32, {3}, {1, 5, 10}))},
      {"{bias_bad}", save(scratch, "bias_bad.npy", HostTensor(DType::kFloat64, {1, 4, 5, 6}))},
      {"{bias_3d}", save(scratch, "bias_3d.npy", HostTensor(DType::kFloat64, {4, 5, 7}))},
      {"{mask_shape}", save(scratch, "mask_shape.npy", HostTensor(DType::kBool, {1, 1, 5, 8}))},
      {"{alibi_shape}", save(scratch, "alibi_shape.npy", HostTensor(DType::kFloat32, {3}))},
      {"{alibi_int}", save(scratch, "alibi_int.npy", HostTensor(DType::kInt32, {4}))},
      {"{offset_nan}",
       save(scratch, "offset_nan.npy",
            HostTensor::from_values(DType::kFloat32, {4}, {0.0, std::nan(""), 0.0, 0.0}))},
      {"{offset_2d}", save(scratch, "offset_2d.npy", HostTensor(DType::kFloat32, {1, 4}))},
      {"{offset_int}", save(scratch, "offset_int.npy", HostTensor(DType::kInt32, {4}))},
  };
  std::string flags = bad.flags;
  for (const auto& [key, path] : paths) {
    for (size_t at = flags.find(key); at != std::string::npos; at = flags.find(key))
      flags.replace(at, key.size(), path);
  }
  // Two cases: DIR does not exist (must not be created), DIR exists (must stay empty).
  for (bool exists : {false, true}) {
    const fs::path out = scratch.path() / (exists ? "existing" : "new");
    if (exists) fs::create_directories(out);
    CliResult r = run_cli("attention " + flags + " --out " + out.string(), scratch);
    EXPECT_NE(r.status, 0) << bad.name;
    EXPECT_EQ(r.status, bad.status) << r.err;
    EXPECT_NE(r.err.find(bad.expected), std::string::npos)
        << bad.name << ": stderr lacks '" << bad.expected << "':\n"
        << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_EQ(fs::exists(out), exists);
    if (exists) {
      EXPECT_TRUE(fs::is_empty(out)) << bad.name;
    }
  }
}

const std::string kGood = "--q {q} --k {k} --v {v} --do {do} --softmax-offset {offset}";

// Issue 15's corpus: every config flag with the values it must refuse, and every input file
// with the ways it can be wrong. Each case expects its flag named on stderr and exit 2.
std::vector<BadCli> generated_bad_cli() {
  std::vector<BadCli> cases;
  auto add = [&](const std::string& name, const std::string& flags, const std::string& named) {
    std::string id = name;
    for (char& c : id)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    cases.push_back(BadCli{id, kGood + " " + flags, named});
  };
  const std::vector<std::pair<std::string, std::vector<std::string>>> values = {
      {"softcap", {"-1", "nan", "inf", "-inf", "abc", "1e39", "1e-46", "1e400", "''", "0x", "1,2"}},
      {"scale", {"0", "-1", "nan", "inf", "abc", "1e39", "1e-40", "''", "-0"}},
      {"dropout", {"1", "1.5", "-0.1", "nan", "inf", "abc", "''"}},
      {"seed", {"-1", "abc", "1.5", "18446744073709551616", "''", "0x10"}},
      {"offset", {"-1", "abc", "99999999999999999999", "''", "1.5"}},
      {"layer-number", {"abc", "1.5", "99999999999999999999", "''"}},
      {"window", {"a,b", "1", "1,2,3", "-2,0", "0,-2", "''", ",", "1,", "9223372036854775808,0"}},
      {"mask", {"diagonal", "''", "CAUSAL", "causal_top_left"}},
      {"softmax-type", {"''", "two", "Learnable", "softmax"}},
      {"bias-type", {"middle", "''", "post"}},
      {"format", {"bhsd", "THD", "''", "bshd,sbhd"}},
      {"backend", {"gpu", "''", "cuda", "CPU"}},
      {"bottom-right-diagonal", {"2", "yes", "-1", "''"}},
  };
  for (const auto& [flag, bad_values] : values)
    for (const std::string& value : bad_values)
      add(flag + "_" + value, "--" + flag + " " + value, "--" + flag);
  // Flags themselves.
  add("deterministic_with_value", "--deterministic=1", "--deterministic");
  add("duplicate_softcap", "--softcap 1 --softcap 2", "--softcap");
  add("softcap_missing_value_at_end", "--softcap", "--softcap");
  add("dropout_value_is_a_flag", "--dropout --seed 1", "--dropout");
  add("scale_1e308", "--scale 1e308", "--scale");
  add("unknown_flag_q2", "--q2 {q}", "--q2");
  add("unknown_long_flag", "--soft-cap 1", "--soft-cap");
  // Input files.
  const std::vector<std::tuple<std::string, std::string, std::string>> files = {
      {"q_text_file", "--q {text} --k {k} --v {v}", "--q"},
      {"q_int32", "--q {q_int} --k {k} --v {v}", "--q"},
      {"q_three_dims", "--q {q_3d} --k {k} --v {v}", "--q"},
      {"q_six_dims", "--q {q_6d} --k {k} --v {v}", "--q"},
      {"k_float32_beside_float64", "--q {q} --k {k_f32} --v {v}", "--k"},
      {"k_head_dim", "--q {q} --k {k_d4} --v {v}", "--k"},
      {"k_batch", "--q {q} --k {k_b1} --v {v}", "--k"},
      {"v_sequence", "--q {q} --k {k} --v {v_s6}", "--v"},
      {"v_missing_file", "--q {q} --k {k} --v {missing}", "--v"},
      {"v_directory", "--q {q} --k {k} --v {directory}", "--v"},
      {"k_dev_zero", "--q {q} --k /dev/zero --v {v}", "--k"},
      {"do_wrong_shape", "--q {q} --k {k} --v {v} --do {do_bad}", "--do"},
      {"do_text", "--q {q} --k {k} --v {v} --do {text}", "--do"},
      {"cu_q_wrong_length", "--q {q} --k {k} --v {v} --cu-seqlens-q {cu_len}", "--cu-seqlens-q"},
      {"cu_q_float", "--q {q} --k {k} --v {v} --cu-seqlens-q {cu_float}", "--cu-seqlens-q"},
      {"cu_kv_beyond", "--q {q} --k {k} --v {v} --cu-seqlens-kv {cu_big}", "--cu-seqlens-kv"},
      {"cu_q_not_from_zero", "--q {q} --k {k} --v {v} --cu-seqlens-q {cu_start}", "--cu-seqlens-q"},
      {"cu_q_directory", "--q {q} --k {k} --v {v} --cu-seqlens-q {directory}", "--cu-seqlens-q"},
      {"bias_wrong_kv", "--q {q} --k {k} --v {v} --bias {bias_bad}", "--bias"},
      {"bias_three_dims", "--q {q} --k {k} --v {v} --bias {bias_3d}", "--bias"},
      {"bias_missing_file", "--q {q} --k {k} --v {v} --bias {missing}", "--bias"},
      {"bias_with_no_bias_type", "--q {q} --k {k} --v {v} --bias {bias_bad} --bias-type no_bias",
       "--bias"},
      {"mask_wrong_shape", "--q {q} --k {k} --v {v} --mask arbitrary --attn-mask {mask_shape}",
       "--attn-mask"},
      {"mask_without_arbitrary", "--q {q} --k {k} --v {v} --attn-mask {mask_shape}", "--attn-mask"},
      {"arbitrary_without_mask", "--q {q} --k {k} --v {v} --mask arbitrary", "--attn-mask"},
      {"alibi_wrong_shape", "--q {q} --k {k} --v {v} --alibi-slopes {alibi_shape}",
       "--alibi-slopes"},
      {"alibi_int32", "--q {q} --k {k} --v {v} --alibi-slopes {alibi_int}", "--alibi-slopes"},
      {"alibi_text", "--q {q} --k {k} --v {v} --alibi-slopes {text}", "--alibi-slopes"},
      {"offset_nan", "--q {q} --k {k} --v {v} --softmax-offset {offset_nan}", "--softmax-offset"},
      {"offset_2d", "--q {q} --k {k} --v {v} --softmax-offset {offset_2d}", "--softmax-offset"},
      {"offset_int32", "--q {q} --k {k} --v {v} --softmax-offset {offset_int}", "--softmax-offset"},
      {"offset_with_off_by_one", kGood + " --softmax-type off-by-one", "--softmax-offset"},
      {"learnable_without_offset", "--q {q} --k {k} --v {v} --softmax-type learnable",
       "--softmax-offset"},
      {"offset_scalar", "--q {q} --k {k} --v {v} --softmax-offset {scalar}", "--softmax-offset"},
      {"padded_offsets_scalar", "--q {q} --k {k} --v {v} --cu-seqlens-q-padded {scalar}",
       "--cu-seqlens-q-padded"},
      {"k_missing", "--q {q} --v {v}", "--k"},
      {"v_missing", "--q {q} --k {k}", "--v"},
      {"k_bool", "--q {q} --k {q_bool} --v {v}", "--k"},
      {"thd_with_four_dims", kGood + " --format thd", "--q"},
      {"padded_offsets_with_bshd", "--q {q} --k {k} --v {v} --cu-seqlens-q-padded {cu_len}",
       "--cu-seqlens-q-padded"},
  };
  for (const auto& [name, flags, named] : files) cases.push_back(BadCli{name, flags, named});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Generated, CliBadInput, ::testing::ValuesIn(generated_bad_cli()),
                         [](const ::testing::TestParamInfo<BadCli>& info) {
                           return info.param.name;
                         });

std::vector<BadCli> handwritten_bad_cli() {
  return {

      BadCli{"negative_softcap", kGood + " --softcap -1", "--softcap"},
      BadCli{"nan_softcap", kGood + " --softcap nan", "--softcap"},
      BadCli{"non_numeric_softcap", kGood + " --softcap big", "--softcap"},
      BadCli{"dropout_above_one", kGood + " --dropout 1.5", "--dropout"},
      BadCli{"offset_wrong_shape", "--q {q} --k {k} --v {v} --do {do} --softmax-offset {offset5}",
             "--softmax-offset"},
      BadCli{"offset_with_vanilla", kGood + " --softmax-type vanilla", "--softmax-offset"},
      BadCli{"non_numeric_window", kGood + " --window left,0", "--window"},
      BadCli{"one_window_value", kGood + " --window 4", "--window"},
      BadCli{"window_right_with_causal", kGood + " --mask causal --window 4,2", "--window"},
      BadCli{"missing_q", "--k {k} --v {v}", "--q"},
      BadCli{"q_file_missing", "--q {missing} --k {k} --v {v}", "--q"},
      BadCli{"heads_not_divisible", "--q {q} --k {k3} --v {k3}", "--k"},
      BadCli{"unknown_mask", kGood + " --mask diagonal", "--mask"},
      BadCli{"unknown_flag", kGood + " --sofcap 2", "--sofcap"},
      BadCli{"unknown_backend", kGood + " --backend gpu", "--backend"},
      BadCli{"zero_scale", kGood + " --scale 0", "--scale"},
      BadCli{"bias_type_without_bias", kGood + " --bias-type pre_scale", "--bias"},
      BadCli{"cu_seqlens_not_monotone", kGood + " --mask padding --cu-seqlens-q {cu_bad}",
             "--cu-seqlens-q"},
      BadCli{"float_mask", kGood + " --mask arbitrary --attn-mask {mask_f}", "--attn-mask"},
      BadCli{"bool_q", "--q {q_bool} --k {k} --v {v}", "--q"},
      BadCli{"forced_backend_rejected", kGood + " --backend cuda_flash", "cuda_flash", 1},
      // Issue 15: values the fp32 paths cannot hold, non-finite slopes, dropped 0-d inputs,
      // inputs that are not files.
      BadCli{"cap_below_fp32", kGood + " --softcap 1e-46", "--softcap"},
      BadCli{"cap_above_fp32", kGood + " --softcap 1e39", "--softcap"},
      BadCli{"scale_above_fp32", kGood + " --scale 1e39", "--scale"},
      BadCli{"window_overflow_is_fine_but_q_is_a_directory",
             "--q {directory} --k {k} --v {v} --window -1,9223372036854775807", "--q"},
      BadCli{"q_is_dev_zero", "--q /dev/zero --k {k} --v {v}", "--q"},
      BadCli{"nan_alibi_slope", kGood + " --alibi-slopes {alibi_nan}", "--alibi-slopes"},
      BadCli{"zero_d_alibi_slopes", kGood + " --alibi-slopes {scalar}", "--alibi-slopes"},
      BadCli{"zero_d_cu_seqlens", kGood + " --cu-seqlens-q {scalar}", "--cu-seqlens-q"},
      BadCli{"flag_where_a_value_belongs", kGood + " --softcap --scale 1",
             "--softcap needs a value"}};
}

INSTANTIATE_TEST_SUITE_P(Cases, CliBadInput, ::testing::ValuesIn(handwritten_bad_cli()),
                         [](const ::testing::TestParamInfo<BadCli>& info) {
                           return info.param.name;
                         });

TEST(CliBadInputCorpus, HasAtLeast150Cases) {
  EXPECT_GE(handwritten_bad_cli().size() + generated_bad_cli().size(), 150u);
}

// Issue 15, data loss: an output name taken by a directory is refused before any compute, and
// the user's existing files stay as they were.
TEST(Cli, OutputNameTakenByADirectoryLeavesExistingFilesUntouched) {
  ScratchDir scratch;
  CaseSpec spec;
  const CaseTensors t = make_case(spec);
  const fs::path out = scratch.path() / "out";
  fs::create_directories(out / "lse.npy");
  std::ofstream(out / "o.npy") << "the user's own file";
  const CliResult r =
      run_cli("attention" + input_flags(scratch, t, false) + " --out " + out.string(), scratch);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--out"), std::string::npos) << r.err;
  EXPECT_EQ(read_text(out / "o.npy"), "the user's own file");
  EXPECT_TRUE(fs::is_directory(out / "lse.npy"));
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(out)) files.insert(entry.path().filename());
  EXPECT_EQ(files, (std::set<std::string>{"o.npy", "lse.npy"}));
}

// A successful run replaces an existing output file and leaves no temporary behind.
TEST(Cli, SuccessfulRunReplacesOutputsAndLeavesNoTemporaries) {
  ScratchDir scratch;
  CaseSpec spec;
  const CaseTensors t = make_case(spec);
  const fs::path out = scratch.path() / "out";
  fs::create_directories(out);
  std::ofstream(out / "o.npy") << "old";
  const CliResult r =
      run_cli("attention" + input_flags(scratch, t, false) + " --out " + out.string(), scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(read_text(out / "o.npy"), "old");
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(out)) files.insert(entry.path().filename());
  EXPECT_EQ(files, (std::set<std::string>{"o.npy", "lse.npy"}));
}

TEST(Cli, ExplainListsEveryBackend) {
  ScratchDir scratch;
  CliResult r = run_cli(
      "explain --shape-q 2,128,8,64 --shape-k 2,128,2,64 --shape-v 2,128,2,64 --mask causal "
      "--softcap 30 --has-softmax-offset --pass backward",
      scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("selected:"), std::string::npos) << r.out;
  for (const Backend* backend : registered_backends()) {
    std::string name(to_string(backend->capabilities().kind));
    EXPECT_NE(r.out.find("  " + name + ": "), std::string::npos) << name << "\n" << r.out;
  }
  // A CUDA device query on host shapes rejects the CPU backends with reasons.
  r = run_cli(
      "explain --format thd --batch 3 --shape-q 100,8,64 --shape-k 120,8,64 --shape-v 120,8,64 "
      "--mask padding_causal --device cuda --dtype bfloat16",
      scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("rejected"), std::string::npos) << r.out;

  r = run_cli("explain --shape-q 2,128,8,64 --shape-k 2,128,3,64 --shape-v 2,128,3,64", scratch);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--shape-k"), std::string::npos) << r.err;
  r = run_cli("explain --shape-q 2,128,8 --shape-k 2,128,2,64 --shape-v 2,128,2,64", scratch);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--shape-q"), std::string::npos) << r.err;
  r = run_cli("explain --format thd --shape-q 100,8,64 --shape-k 100,8,64 --shape-v 100,8,64",
              scratch);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--batch"), std::string::npos) << r.err;
}

TEST(Cli, HelpAndUnknownCommands) {
  ScratchDir scratch;
  for (const char* args : {"--help", "attention --help", "explain --help", "run --help"}) {
    CliResult r = run_cli(args, scratch);
    EXPECT_EQ(r.status, 0) << args;
    EXPECT_NE(r.out.find("usage: dpa"), std::string::npos) << args << ": " << r.out;
  }
  CliResult r = run_cli("attention --help", scratch);
  for (const char* flag : {"--softcap", "--softmax-offset", "--window", "--cu-seqlens-kv-padded",
                           "--attn-mask", "--backend", "--do"}) {
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  }
  r = run_cli("frobnicate", scratch);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("frobnicate"), std::string::npos);
  r = run_cli("", scratch);
  EXPECT_EQ(r.status, 2);
}

// `dpa bench` checks its flags before it looks for a device, so bad values fail the same way
// with and without CUDA: exit 2, the flag named, nothing on stdout.
TEST(Cli, BenchRejectsBadDropoutAndListsItsFlags) {
  ScratchDir scratch;
  for (const char* args : {"bench --dropout 1.5", "bench --dropout -0.1", "bench --dropout nan",
                           "bench --dropout often"}) {
    CliResult r = run_cli(args, scratch);
    EXPECT_EQ(r.status, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find("--dropout"), std::string::npos) << args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << args << ": " << r.out;
  }
  // --decode (KvCacheAttention over a cache): what the KV-cache call cannot take.
  for (const auto& [args, flag] :
       {std::pair{"bench --page-size 16", "--page-size"},
        std::pair{"bench --decode --page-size 3", "--page-size"},
        std::pair{"bench --append", "--append"},
        std::pair{"bench --decode --append --shapes 1,8,8,64,32,64", "--append"},
        std::pair{"bench --decode --pass bwd", "--decode"},
        std::pair{"bench --decode --dropout 0.1", "--decode"},
        std::pair{"bench --decode --mask padding", "--decode"},
        std::pair{"bench --decode --varlen", "--varlen"},
        std::pair{"bench --flash-forward-kernel tma", "--flash-forward"},
        std::pair{"bench --flash-backward-kernel wgmma", "--flash-backward"},
        std::pair{"bench --pad-mib -1", "--pad-mib"},
        std::pair{"bench --pad-mib lots", "--pad-mib"}}) {
    CliResult r = run_cli(args, scratch);
    EXPECT_EQ(r.status, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << args << ": " << r.out;
  }
  CliResult r = run_cli("bench --help", scratch);
  EXPECT_EQ(r.status, 0);
  for (const char* flag :
       {"--dropout", "--deterministic", "--softcap", "--pass", "--decode", "--page-size",
        "--varlen", "--flash-forward-kernel", "--flash-backward-kernel", "--graph", "--append"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
}

TEST(Cli, DemoRunsAndChecksItself) {
  ScratchDir scratch;
  CliResult r = run_cli("run --quick --seqlen 96 --check-len 64", scratch);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("all checks passed"), std::string::npos) << r.out;
  for (const char* text : {"gemma2 local", "gemma2 global", "gpt-oss local", "gpt-oss global",
                           "GFLOP/s", "cpu_exact", "softcap 50 moves o", "the sinks move o"}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << text << "\n" << r.out;
  }
  EXPECT_NE(r.err.find("[4/4]"), std::string::npos) << r.err;
}

// cp-check prints one row per output and gradient; with a bias and an arbitrary mask every
// relative error (dbias included) is at fp32-merge level.
// Issue 15: huge declared sizes end in an error naming the flag, not a bare bad_alloc.
TEST(Cli, ExplainRefusesSizesBeyondWhatDpaIndexes) {
  ScratchDir scratch;
  CliResult thd = run_cli(
      "explain --format thd --batch 1099511627776 --shape-q 16,4,64 --shape-k 16,4,64 "
      "--shape-v 16,4,64",
      scratch);
  EXPECT_EQ(thd.status, 2);
  EXPECT_NE(thd.err.find("--batch"), std::string::npos) << thd.err;
  CliResult bshd = run_cli(
      "explain --shape-q 1099511627776,1,4,64 --shape-k 1099511627776,1,4,64 "
      "--shape-v 1099511627776,1,4,64",
      scratch);
  EXPECT_EQ(bshd.status, 2);
  EXPECT_NE(bshd.err.find("--shape-q"), std::string::npos) << bshd.err;
  EXPECT_EQ(bshd.err.find("bad_alloc"), std::string::npos) << bshd.err;
}

// Issue 15: cp-check used to exit 0 whatever it measured.
TEST(Cli, CpCheckFailsAboveItsToleranceAndValidatesItsFlags) {
  ScratchDir scratch;
  const std::string base = "cp-check --cp 2 --seqlen 16 --heads 4 --kv-heads 2 --head-dim 8";
  CliResult strict = run_cli(base + " --softcap 2 --tolerance 1e-300", scratch);
  EXPECT_EQ(strict.status, 1) << strict.out << strict.err;
  EXPECT_NE(strict.err.find("--tolerance"), std::string::npos) << strict.err;
  CliResult density = run_cli(base + " --mask arbitrary --mask-density 1.5", scratch);
  EXPECT_EQ(density.status, 2);
  EXPECT_NE(density.err.find("--mask-density"), std::string::npos) << density.err;
  // A library error about a tensor names a cp-check flag, never explain's --shape-q.
  CliResult heads = run_cli(base + " --kv-heads 3", scratch);
  EXPECT_EQ(heads.status, 2);
  EXPECT_EQ(heads.err.find("--shape-"), std::string::npos) << heads.err;
  EXPECT_NE(heads.err.find("--kv-heads"), std::string::npos) << heads.err;
  CliResult zero = run_cli("cp-check --cp 0", scratch);
  EXPECT_EQ(zero.status, 2);
  EXPECT_NE(zero.err.find("--cp"), std::string::npos) << zero.err;
  EXPECT_EQ(zero.err.find("--seqlen"), std::string::npos) << zero.err;
}

TEST(Cli, CpCheckWithBiasAndArbitraryMask) {
  ScratchDir scratch;
  CliResult r = run_cli(
      "cp-check --cp 2 --comm p2p --seqlen 16 --heads 4 --kv-heads 2 --head-dim 8 --bias "
      "--mask arbitrary --window 4,4",
      scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  int rows = 0;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string name, extra;
    double max_abs = 0, relative = 0;
    fields >> name;
    if (name == "dbias") fields >> extra;  // "dbias (sum)"
    if (!(fields >> max_abs >> relative)) continue;
    EXPECT_LT(relative, 1e-5) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 6) << r.out;  // o, lse, dq, dk, dv, dbias
  EXPECT_NE(r.out.find("dbias (sum)"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dpa::test
