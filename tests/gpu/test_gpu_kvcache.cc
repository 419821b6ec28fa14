// KvCacheAttention on device tensors (the KV-cache kernels, docs/kvcache.md) against the truth:
// each sequence as an ordinary cpu_exact call over its keys, on the same rounded inputs. Every
// case of the host suite (tests/support/kvcache_cases.h) at the kernels' head dims and both
// 16-bit dtypes, plus long sequences that split the keys; the caches after the append; the
// debug mode that checks the tables; the refusals.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/workspace.h"
#include "dpa/kvcache.h"
#include "gpu/device_case.h"
#include "support/kvcache_cases.h"

namespace dpa::test {
namespace {

// Device copies of a case's tensors; a host view (shape and strides, possibly adjusted by the
// case) maps onto the copy of its storage.
class DeviceMirror {
 public:
  TensorView operator()(const HostTensor& host) {
    if (!host.defined()) return TensorView();
    owned_.push_back(std::make_unique<DeviceTensor>(host));
    copies_[&host] = owned_.back().get();
    TensorView view = host.view();
    view.data = owned_.back()->view().data;
    view.device = Device::kCUDA;
    view.device_index = owned_.back()->view().device_index;
    return view;
  }
  const DeviceTensor& copy_of(const HostTensor& host) const { return *copies_.at(&host); }

 private:
  std::vector<std::unique_ptr<DeviceTensor>> owned_;
  std::map<const HostTensor*, const DeviceTensor*> copies_;
};

// Every input of the case on the device (o and lse are the caller's).
KvCacheArgs device_inputs(const KvCacheCase& c, DeviceMirror& mirror) {
  KvCacheArgs a;
  a.q = mirror(c.q);
  a.cu_seqlens_q = mirror(c.cu_seqlens_q);
  a.k_cache = mirror(c.k_cache);
  a.v_cache = mirror(c.v_cache);
  a.block_table = mirror(c.block_table);
  a.cache_seqlens = mirror(c.cache_seqlens);
  a.k_new = mirror(c.k_new);
  a.v_new = mirror(c.v_new);
  a.cu_seqlens_k_new = mirror(c.cu_seqlens_k_new);
  a.alibi_slopes = mirror(c.alibi_slopes);
  a.softmax_offset = mirror(c.softmax_offset);
  return a;
}

class Stream {
 public:
  Stream() { cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

struct DeviceResult {
  HostTensor o, lse, k_cache, v_cache;
  BackendKind backend = BackendKind::kAuto;
};

// Runs the case with every tensor on the device, on a non-blocking stream, o and lse poisoned;
// `captured`: the call is captured into a CUDA graph and runs as one launch of it.
DeviceResult run_on_device(const KvCacheConfig& config, const KvCacheCase& c,
                           bool captured = false) {
  DeviceMirror mirror;
  const HostTensor o_host = c.make_o(), lse_host = c.make_lse();
  KvCacheArgs a = device_inputs(c, mirror);
  DeviceTensor o(o_host.dtype(), o_host.shape()), lse(DType::kFloat32, lse_host.shape());
  a.o = o.view();
  a.lse = lse.view();
  Stream stream;
  a.stream = stream.get();
  DeviceResult result;
  KvCacheAttention attention(config);
  auto call = [&] { result.backend = attention.forward(a); };
  if (captured)
    run_captured(stream.get(), call);
  else
    call();
  result.o = o.download(stream.get());
  result.lse = lse.download(stream.get());
  result.k_cache = mirror.copy_of(c.k_cache).download(stream.get());
  result.v_cache = mirror.copy_of(c.v_cache).download(stream.get());
  return result;
}

struct Variant {
  DType dtype;
  int64_t head_dim;
};

std::string variant_name(const Variant& v) {
  return std::string(to_string(v.dtype)) + "_d" + std::to_string(v.head_dim);
}

// Cases of the device suite only: keys enough to split, long windows, long prefill chunks.
std::vector<KvCase> long_cases() {
  return {
      {"long_decode_splits",
       [](KvCacheCaseSpec& s) {
         decode_spec(s, {3000, 777, 0}, 64);
         s.heads_q = 16;
         s.heads_kv = 2;
         s.config.softmax_type = SoftmaxType::kLearnable;
       },
       {},
       {}},
      {"long_decode_contiguous_mha",
       [](KvCacheCaseSpec& s) {
         decode_spec(s, {2500, 64}, 0);
         s.heads_q = s.heads_kv = 3;
       },
       {},
       {}},
      {"long_window_sink_softcap",  // gpt-oss local layers: the window bounds the keys read
       [](KvCacheCaseSpec& s) {
         decode_spec(s, {5000, 130}, 16);
         s.heads_q = 8;
         s.heads_kv = 1;
         s.config.window_left = 127;
         s.config.window_right = 0;
         s.config.softcap = 5.0;
         s.qk_stddev = 2.0;
         s.config.softmax_type = SoftmaxType::kLearnable;
       },
       [](KvCacheConfig& config, KvCacheCase&) { config.window_left = -1; },
       {}},
      {"long_prefill_chunk",
       [](KvCacheCaseSpec& s) {
         s.cached = {1200, 40};
         s.added = {90, 90};
         s.queries = {90, 90};
         s.heads_q = 4;
         s.heads_kv = 2;
         s.page_size = 16;
         s.config.causal = true;
         s.config.softcap = 3.0;
         s.qk_stddev = 2.0;
       },
       [](KvCacheConfig& config, KvCacheCase&) { config.softcap = 0.0; },
       {}},
      // Prefill chunks of at least kKvCacheFlashPrefillQueries queries run on cuda_flash's
      // forward at d = 64 and 128 (its producer reads the pages): contiguous and 1- and
      // 256-token pages, ragged and empty caches, each feature.
      {"long_prefill_contiguous_window_sink",
       [](KvCacheCaseSpec& s) {
         s.cached = {300, 0, 77};
         s.added = {70, 70, 70};
         s.queries = {70, 70, 70};
         s.heads_q = 8;
         s.heads_kv = 2;
         s.config.causal = true;
         s.config.window_left = 50;
         s.config.softmax_type = SoftmaxType::kLearnable;
       },
       [](KvCacheConfig& config, KvCacheCase&) { config.window_left = -1; },
       {}},
      {"long_prefill_page1_alibi",
       [](KvCacheCaseSpec& s) {
         s.cached = {100, 5};
         s.added = {64, 64};
         s.queries = {64, 64};
         s.heads_q = s.heads_kv = 4;
         s.page_size = 1;
         s.alibi = true;
       },
       [](KvCacheConfig&, KvCacheCase& c) { c.alibi_slopes = HostTensor(); },
       {}},
      {"long_prefill_page256_off_by_one_softcap",
       [](KvCacheCaseSpec& s) {
         s.cached = {0, 600};
         s.added = {100, 100};
         s.queries = {100, 100};
         s.heads_q = 8;
         s.heads_kv = 1;
         s.page_size = 256;
         s.config.causal = true;
         s.config.softcap = 4.0;
         s.qk_stddev = 2.0;
         s.config.softmax_type = SoftmaxType::kOffByOne;
       },
       [](KvCacheConfig& config, KvCacheCase&) { config.softcap = 0.0; },
       {}},
      {"long_chunked_prefill_packed_alibi",
       [](KvCacheCaseSpec& s) {
         s.cached = {700, 0, 1500};
         s.added = {1, 200, 1};
         s.queries = {1, 200, 1};
         s.packed_q = s.packed_new = true;
         s.page_size = 32;
         s.config.causal = true;
         s.alibi = true;
       },
       [](KvCacheConfig&, KvCacheCase& c) { c.alibi_slopes = HostTensor(); },
       {}},
  };
}

std::vector<KvCase> device_cases() {
  std::vector<KvCase> cases;
  for (const KvCase& c : kvcache_cases())
    if (c.name != "head_dim_v_differs") cases.push_back(c);  // refused: see below
  for (const KvCase& c : long_cases()) cases.push_back(c);
  return cases;
}

class GpuKvCache : public ::testing::TestWithParam<std::tuple<KvCase, Variant>> {};

TEST_P(GpuKvCache, MatchesExactWithTheCacheAppended) {
  std::string why;
  if (!gpu_present(&why) && !reference_only_mode()) GTEST_SKIP() << why;
  const auto& [kv, variant] = GetParam();
  KvCacheCaseSpec spec;
  kv.configure(spec);
  spec.nan_past_sequences = true;
  spec.dtype = variant.dtype;
  spec.head_dim_qk = spec.head_dim_v = variant.head_dim;
  KvCacheCase c = make_kvcache_case(spec);
  if (kv.adjust) kv.adjust(spec, c);
  const double tol = output_tolerance(spec.dtype);

  const KvCaseTruth truth = kvcache_truth(kv, spec, c);
  // The feature moves the truth by far more than the tolerance.
  if (kv.without) {
    ASSERT_GT(truth.feature_effect, 10 * tol);
  }
  if (reference_only_mode()) GTEST_SKIP() << "reference only";

  HostTensor want_k = c.k_cache, want_v = c.v_cache;
  expected_caches(spec, c, want_k, want_v);
  const DeviceResult got = run_on_device(spec.config, c);
  EXPECT_EQ(got.backend, BackendKind::kCudaFlash);
  EXPECT_LE(relative_error(got.o, truth.o), tol);
  EXPECT_FALSE(has_nan(got.o));
  EXPECT_LE(lse_violation(got.lse, truth.lse), 1.0);
  EXPECT_TRUE(same_values(got.k_cache, want_k));
  EXPECT_TRUE(same_values(got.v_cache, want_v));
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuKvCache,
                         ::testing::Combine(::testing::ValuesIn(device_cases()),
                                            ::testing::Values(Variant{DType::kBFloat16, 128},
                                                              Variant{DType::kFloat16, 64},
                                                              Variant{DType::kBFloat16, 256})),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" +
                                  variant_name(std::get<1>(info.param));
                         });

// Rows of a packed q past its last sequence: o = 0 and the empty row's LSE, as on the host.
TEST(GpuKvCacheRows, RowsPastTheLastSequenceAreEmptyRows) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << why;
  KvCacheCaseSpec spec = rows_past_the_last_sequence_spec();
  spec.cached[0] = 200;  // several tiles
  spec.page_size = 16;
  spec.dtype = DType::kBFloat16;
  spec.head_dim_qk = spec.head_dim_v = 128;
  KvCacheCase c;
  const KvCaseTruth truth = build_with_rows_past_the_last_sequence(spec, 3, c);
  const DeviceResult got = run_on_device(spec.config, c);
  EXPECT_LE(relative_error(got.o, truth.o), output_tolerance(spec.dtype));
  EXPECT_LE(lse_violation(got.lse, truth.lse), 1.0);
  const int64_t row = spec.heads_q * spec.head_dim_v;  // the gap rows: exactly 0
  for (int64_t n = (c.q.shape()[0] - 3) * row; n < got.o.numel(); ++n)
    ASSERT_EQ(got.o.get(n), 0.0) << n;
}

// A call given a workspace of exactly workspace_size() bytes takes its partials from it (no
// shortfall) and writes what the call without one writes.
TEST(GpuKvCacheWorkspace, SplitPartialsComeFromTheCallersBlock) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << why;
  KvCacheCaseSpec spec;
  decode_spec(spec, {3000, 777, 0}, 64);
  spec.dtype = DType::kBFloat16;
  spec.heads_q = 16;
  spec.heads_kv = 2;
  spec.head_dim_qk = spec.head_dim_v = 128;
  const KvCacheCase c = make_kvcache_case(spec);
  const DeviceResult plain = run_on_device(spec.config, c);

  DeviceMirror mirror;
  KvCacheArgs a = device_inputs(c, mirror);
  // The append already ran in `plain`'s copies, not in these: the same call again.
  const DeviceTensor o(c.make_o()), lse(c.make_lse());
  a.o = o.view();
  a.lse = lse.view();
  KvCacheAttention attention(spec.config);
  const size_t bytes = attention.workspace_size(a);
  ASSERT_GT(bytes, 0u) << "the case should split its keys";
  const DeviceTensor block(DType::kBool, {int64_t(bytes)});  // one byte per element
  a.workspace.data = block.view().data;
  a.workspace.bytes = bytes;
  const uint64_t shortfall_before = workspace_shortfall_bytes();
  attention.forward(a);
  EXPECT_EQ(workspace_shortfall_bytes(), shortfall_before);
  EXPECT_EQ(max_abs_error(o.download(), plain.o), 0.0);
  EXPECT_EQ(max_abs_error(lse.download(), plain.lse), 0.0);
}

// A prefill chunk on cuda_flash's forward with no LSE asked for and a workspace of exactly
// workspace_size() bytes: its tables and the kernel's LSE come from that block, and o is what
// the call with an LSE writes.
TEST(GpuKvCacheWorkspace, APrefillOnFlashTakesItsScratchFromTheCallersBlock) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << why;
  KvCacheCaseSpec spec;
  spec.cached = {500, 3};
  spec.added = spec.queries = {80, 80};
  spec.page_size = 16;
  spec.config.causal = true;
  spec.dtype = DType::kBFloat16;
  spec.head_dim_qk = spec.head_dim_v = 128;
  const KvCacheCase c = make_kvcache_case(spec);
  const DeviceResult with_lse = run_on_device(spec.config, c);

  DeviceMirror mirror;
  KvCacheArgs a = device_inputs(c, mirror);
  const DeviceTensor o(c.make_o());
  a.o = o.view();
  KvCacheAttention attention(spec.config);
  const size_t bytes = attention.workspace_size(a);
  ASSERT_GT(bytes, 0u) << "the tables and the LSE take scratch";
  const DeviceTensor block(DType::kBool, {int64_t(bytes)});  // one byte per element
  a.workspace.data = block.view().data;
  a.workspace.bytes = bytes;
  const uint64_t shortfall_before = workspace_shortfall_bytes();
  attention.forward(a);
  EXPECT_EQ(workspace_shortfall_bytes(), shortfall_before);
  EXPECT_EQ(max_abs_error(o.download(), with_lse.o), 0.0);
}

// A decode step captured into a CUDA graph, as serving engines replay decode (the global capture
// mode, torch.cuda.graph's default), gives the bits of the eager step, the appended caches
// included: with split keys (the partials from the library's pool: graph allocations) and
// 1-token and 16-token pages.
TEST(GpuKvCacheGraphs, ACapturedDecodeStepGivesTheEagerBits) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << why;
  for (const int64_t page_size : {0, 1, 16}) {
    KvCacheCaseSpec spec;
    decode_spec(spec, {3000, 777, 0}, page_size);
    spec.dtype = DType::kBFloat16;
    spec.heads_q = 16;
    spec.heads_kv = 2;
    spec.head_dim_qk = spec.head_dim_v = 128;
    spec.config.softmax_type = SoftmaxType::kLearnable;
    const KvCacheCase c = make_kvcache_case(spec);
    const DeviceResult eager = run_on_device(spec.config, c);
    const DeviceResult captured = run_on_device(spec.config, c, /*captured=*/true);
    const std::string what = "page size " + std::to_string(page_size);
    EXPECT_EQ(max_abs_error(captured.o, eager.o), 0.0) << what;
    EXPECT_EQ(max_abs_error(captured.lse, eager.lse), 0.0) << what;
    EXPECT_TRUE(same_values(captured.k_cache, eager.k_cache)) << what;
    EXPECT_TRUE(same_values(captured.v_cache, eager.v_cache)) << what;
  }
}

// A decode case whose tensors the tests below break.
KvCacheCaseSpec small_decode() {
  KvCacheCaseSpec spec;
  decode_spec(spec, {30, 7}, 16);
  spec.dtype = DType::kBFloat16;
  spec.head_dim_qk = spec.head_dim_v = 64;
  return spec;
}

// Expects the call to fail with `code` naming `argument`, the caches and o unwritten.
// `call` throws code naming `argument`.
template <typename Call>
void expect_error(const Call& call, ErrorCode code, const std::string& argument) {
  try {
    call();
    ADD_FAILURE() << "the call ran; expected an error naming " << argument;
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), code) << error.what();
    EXPECT_EQ(error.argument(), argument) << error.what();
  }
}

void expect_refused(const KvCacheConfig& config, const KvCacheCase& c, ErrorCode code,
                    const std::string& argument) {
  expect_error([&] { run_on_device(config, c); }, code, argument);
}

TEST(GpuKvCacheTables, CheckedInDebugModeWithNothingWritten) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << why;
  KvCacheCaseSpec spec = small_decode();
  spec.config.check_tables = true;
  KvCacheCase c = make_kvcache_case(spec);
  c.block_table.set(1, 1000);  // page 1 of sequence 0: outside the pool
  DeviceMirror mirror;
  // run_on_device downloads nothing when the call throws; check the caches by hand.
  HostTensor o_host = c.make_o();
  KvCacheArgs a = device_inputs(c, mirror);
  const DeviceTensor o(o_host);  // a sentinel, not NaN: NaN != NaN would hide a write
  a.o = o.view();
  expect_error([&] { KvCacheAttention(spec.config).forward(a); }, ErrorCode::kInvalidArgument,
               "block_table");
  EXPECT_EQ(max_abs_error(mirror.copy_of(c.k_cache).download(), c.k_cache), 0.0);
  EXPECT_EQ(max_abs_error(o.download(), o_host), 0.0);
  // Lengths beyond the capacity, too.
  c.block_table.set(1, 1);
  c.cache_seqlens.set(0, 100000);
  expect_refused(spec.config, c, ErrorCode::kInvalidArgument, "cache_seqlens");
}

TEST(GpuKvCacheRefusals, WhatTheKernelsDoNotTakeIsRefusedNamingTheTensor) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << why;
  {
    KvCacheCaseSpec spec = small_decode();
    spec.head_dim_v = 32;
    expect_refused(spec.config, make_kvcache_case(spec), ErrorCode::kNotSupported, "v_cache");
  }
  {
    KvCacheCaseSpec spec = small_decode();
    spec.head_dim_qk = spec.head_dim_v = 96;
    expect_refused(spec.config, make_kvcache_case(spec), ErrorCode::kNotSupported, "q");
  }
  {
    KvCacheCaseSpec spec = small_decode();
    spec.dtype = DType::kFloat32;
    expect_refused(spec.config, make_kvcache_case(spec), ErrorCode::kNotSupported, "q");
  }
  {
    KvCacheCaseSpec spec = small_decode();
    spec.config.backend = BackendKind::kCudaUnfused;
    expect_refused(spec.config, make_kvcache_case(spec), ErrorCode::kNotSupported, "backend");
  }
  {  // rows off their 16-byte boundaries: the cache seen one element in
    const KvCacheCaseSpec spec = small_decode();
    const KvCacheCase c = make_kvcache_case(spec);
    DeviceMirror mirror;
    KvCacheArgs a = device_inputs(c, mirror);
    // Refused before anything reads it (the view's last 2 bytes lie past the copy).
    a.k_cache.data = static_cast<char*>(a.k_cache.data) + 2;
    const DeviceTensor o(c.make_o());
    a.o = o.view();
    expect_error([&] { KvCacheAttention(spec.config).forward(a); }, ErrorCode::kNotSupported,
                 "k_cache");
  }
}

}  // namespace
}  // namespace dpa::test
