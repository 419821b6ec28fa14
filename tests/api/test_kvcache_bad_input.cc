// Bad input to KvCacheAttention (DESIGN.md §7): each case raises dpa::Error naming the argument,
// and neither the cache nor the outputs are written.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <ostream>
#include <string>

#include "support/kvcache_case.h"

namespace dpa::test {
namespace {

struct BadKvInput {
  std::string name;
  std::string argument;
  std::function<void(KvCacheCaseSpec&)> configure;  // before the case is built
  std::function<void(KvCacheCase&, KvCacheArgs&)> corrupt;
  ErrorCode code = ErrorCode::kInvalidArgument;
};

void PrintTo(const BadKvInput& bad, std::ostream* os) { *os << bad.name; }

void none(KvCacheCaseSpec&) {}

// A paged decode-and-append case: two sequences, pages of 4, a pool with spare pages.
KvCacheCaseSpec base_spec() {
  KvCacheCaseSpec spec;
  spec.cached = {9, 5};
  spec.added = {2, 2};
  spec.queries = {2, 2};
  spec.page_size = 4;
  spec.capacity = 16;
  spec.config.causal = true;
  return spec;
}

void set_table(KvCacheCase& c, int64_t i, int64_t p, int32_t page) {
  c.block_table.set(i * c.block_table.shape()[1] + p, page);
}

int32_t table(const KvCacheCase& c, int64_t i, int64_t p) {
  return int32_t(c.block_table.get(i * c.block_table.shape()[1] + p));
}

const BadKvInput kBad[] = {
    {"block_table_past_the_pool", "block_table", none,
     [](KvCacheCase& c, KvCacheArgs&) { set_table(c, 1, 0, int32_t(c.k_cache.shape()[0])); }},
    {"block_table_negative_in_use", "block_table", none,
     [](KvCacheCase& c, KvCacheArgs&) { set_table(c, 0, 2, -1); }},
    {"two_sequences_append_to_one_page", "block_table", none,
     // Sequence 1 appends at positions 5, 6 (its page 1); point it at sequence 0's page 2,
     // where sequence 0 appends at 9, 10: rows 1 and 2 of that page are written twice.
     [](KvCacheCase& c, KvCacheArgs&) { set_table(c, 1, 1, table(c, 0, 2)); }},
    {"append_over_a_page_another_reads", "block_table", none,
     // Sequence 1's appends land on sequence 0's page 0, which sequence 0 reads.
     [](KvCacheCase& c, KvCacheArgs&) { set_table(c, 1, 1, table(c, 0, 0)); }},
    {"a_page_listed_twice_in_one_table", "block_table", none,
     // Sequence 0's third page is its first: its appends (9, 10) land on rows it reads (1, 2).
     [](KvCacheCase& c, KvCacheArgs&) { set_table(c, 0, 2, table(c, 0, 0)); }},
    {"cache_seqlens_past_capacity", "cache_seqlens", none,
     [](KvCacheCase& c, KvCacheArgs&) { c.cache_seqlens.set(0, 15); }},  // 15 + 2 > 16
    // A table declared long enough for any length: the lengths themselves must stay int32
    // positions (the kernels' keys), checked before any page of the table is read.
    {"cache_seqlens_past_int32_positions", "cache_seqlens", none,
     [](KvCacheCase& c, KvCacheArgs& a) {
       if (a.block_table.defined()) a.block_table.shape[1] = int64_t(1) << 40;
       c.cache_seqlens.set(0, double(std::numeric_limits<int32_t>::max()));
     }},
    {"cache_seqlens_negative", "cache_seqlens", none,
     [](KvCacheCase& c, KvCacheArgs&) { c.cache_seqlens.set(1, -1); }},
    {"cache_seqlens_missing", "cache_seqlens", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.cache_seqlens = TensorView(); }},
    {"cache_seqlens_wrong_batch", "cache_seqlens", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.cache_seqlens.shape[0] = 1; }},
    {"cache_seqlens_float", "cache_seqlens", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.cache_seqlens.dtype = DType::kFloat32; }},
    {"page_size_not_power_of_two", "k_cache", [](KvCacheCaseSpec& s) { s.page_size = 3; },
     [](KvCacheCase&, KvCacheArgs&) {}},
    {"page_size_past_256", "k_cache",
     [](KvCacheCaseSpec& s) {
       s.page_size = 512;
       s.capacity = 512;
       s.spare_pages = 0;
     },
     [](KvCacheCase&, KvCacheArgs&) {}},
    {"v_cache_heads_differ", "v_cache", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.v_cache.shape[2] = 1; }},
    {"k_cache_head_dim_differs", "k_cache", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.k_cache.shape[3] = 4; }},
    {"heads_not_a_multiple", "k_cache", [](KvCacheCaseSpec& s) { s.heads_q = 3; },
     [](KvCacheCase&, KvCacheArgs&) {}},
    {"k_cache_dtype_differs", "k_cache", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.k_cache.dtype = DType::kFloat32; }},
    {"k_cache_strided_head_dim", "k_cache", none,
     [](KvCacheCase&, KvCacheArgs& a) {
       a.k_cache.shape[3] /= 2;
       a.k_cache.strides[3] = 2;
       a.q.shape[3] /= 2;
     }},
    {"k_new_heads_differ", "k_new", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.k_new.shape[2] = 1; }},
    {"k_new_without_v_new", "v_new", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.v_new = TensorView(); }},
    {"v_new_rows_differ", "v_new", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.v_new.shape[1] = 1; }},
    {"k_new_overlaps_the_cache", "k_new", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.k_new.data = a.k_cache.data; }},
    {"o_overlaps_the_cache", "o", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.o.data = a.v_cache.data; }},
    {"o_is_q", "o", none, [](KvCacheCase&, KvCacheArgs& a) { a.o.data = a.q.data; }},
    {"lse_inside_o", "lse", none, [](KvCacheCase&, KvCacheArgs& a) { a.lse.data = a.o.data; }},
    {"o_expanded_over_queries", "o", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.o.strides[1] = 0; }},
    // Every position of a sequence would be one slot: the append writes it twice.
    {"k_cache_expanded_over_positions_with_an_append", "k_cache", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.k_cache.strides[1] = 0; }},
    // A workspace on the 256-byte boundary it needs, inside the cache's bytes.
    {"workspace_over_the_cache", "workspace", none,
     [](KvCacheCase&, KvCacheArgs& a) {
       const auto at = reinterpret_cast<uintptr_t>(a.k_cache.data);
       a.workspace.data = reinterpret_cast<void*>((at + 255) & ~uintptr_t(255));
       a.workspace.bytes = 256;
     }},
    {"cu_seqlens_k_new_without_packed_k_new", "cu_seqlens_k_new", none,
     [](KvCacheCase& c, KvCacheArgs& a) { a.cu_seqlens_k_new = c.cache_seqlens.view(); }},
    {"packed_k_new_without_cu_seqlens_k_new", "cu_seqlens_k_new",
     [](KvCacheCaseSpec& s) { s.packed_new = true; },
     [](KvCacheCase&, KvCacheArgs& a) { a.cu_seqlens_k_new = TensorView(); }},
    {"cu_seqlens_k_new_past_k_new", "cu_seqlens_k_new",
     [](KvCacheCaseSpec& s) { s.packed_new = true; },
     [](KvCacheCase& c, KvCacheArgs&) { c.cu_seqlens_k_new.set(2, 9); }},
    {"packed_q_without_cu_seqlens_q", "cu_seqlens_q", [](KvCacheCaseSpec& s) { s.packed_q = true; },
     [](KvCacheCase&, KvCacheArgs& a) { a.cu_seqlens_q = TensorView(); }},
    {"cu_seqlens_q_decreasing", "cu_seqlens_q", [](KvCacheCaseSpec& s) { s.packed_q = true; },
     [](KvCacheCase& c, KvCacheArgs&) {
       c.cu_seqlens_q.set(1, 3);
       c.cu_seqlens_q.set(2, 1);
     }},
    {"cu_seqlens_q_with_a_4d_q", "cu_seqlens_q", none,
     [](KvCacheCase& c, KvCacheArgs& a) { a.cu_seqlens_q = c.cache_seqlens.view(); }},
    {"contiguous_cache_batch_differs", "k_cache", [](KvCacheCaseSpec& s) { s.page_size = 0; },
     [](KvCacheCase&, KvCacheArgs& a) {
       a.k_cache.shape[0] = 1;
       a.v_cache.shape[0] = 1;
     }},
    {"o_wrong_shape", "o", none, [](KvCacheCase&, KvCacheArgs& a) { a.o.shape[1] = 1; }},
    {"lse_wrong_shape", "lse", none, [](KvCacheCase&, KvCacheArgs& a) { a.lse.shape[2] = 1; }},
    {"learnable_without_offsets", "softmax_offset",
     [](KvCacheCaseSpec& s) { s.config.softmax_type = SoftmaxType::kLearnable; },
     [](KvCacheCase&, KvCacheArgs& a) { a.softmax_offset = TensorView(); }},
    {"v_cache_is_k_cache", "v_cache", none,
     [](KvCacheCase&, KvCacheArgs& a) {
       a.v_cache = a.k_cache;
       a.v_new.shape[3] = a.k_new.shape[3];
     }},
    {"q_inside_the_cache", "q", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.q.data = a.k_cache.data; }},
    {"lse_inside_the_cache", "lse", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.lse.data = a.v_cache.data; }},
    {"k_new_without_data", "k_new", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.k_new.data = nullptr; }},
    {"forced_device_backend", "backend",
     [](KvCacheCaseSpec& s) { s.config.backend = BackendKind::kCudaFlash; },
     [](KvCacheCase&, KvCacheArgs&) {}, ErrorCode::kNotSupported},
    {"mixed_devices", "k_cache", none,
     [](KvCacheCase&, KvCacheArgs& a) { a.k_cache.device = Device::kCUDA; },
     ErrorCode::kInvalidArgument},
    // Every tensor claims a device that this machine lacks (CI: no GPU, or no CUDA build): the
    // KV-cache kernels refuse before anything reads the (host) memory.
    {"device_call_without_a_device", "q", none,
     [](KvCacheCase&, KvCacheArgs& a) {
       for (TensorView* t : {&a.q, &a.k_cache, &a.v_cache, &a.block_table, &a.cache_seqlens,
                             &a.k_new, &a.v_new, &a.o, &a.lse})
         if (t->defined()) {
           t->device = Device::kCUDA;
           t->device_index = 7;
         }
     },
     ErrorCode::kNotSupported},
};

class KvCacheValidation : public ::testing::TestWithParam<BadKvInput> {};

TEST_P(KvCacheValidation, RejectsNamingTheArgumentAndWritesNothing) {
  const BadKvInput& bad = GetParam();
  KvCacheCaseSpec spec = base_spec();
  bad.configure(spec);
  KvCacheCase c = make_kvcache_case(spec);
  HostTensor o = c.make_o(), lse = c.make_lse();
  KvCacheArgs args = c.args(o, &lse);
  bad.corrupt(c, args);
  const HostTensor k_before = c.k_cache, v_before = c.v_cache, o_before = o, lse_before = lse;
  try {
    KvCacheAttention(spec.config).forward(args);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.argument(), bad.argument) << error.what();
    EXPECT_EQ(error.code(), bad.code) << error.what();
  }
  EXPECT_EQ(max_abs_error(c.k_cache, k_before), 0.0);
  EXPECT_EQ(max_abs_error(c.v_cache, v_before), 0.0);
  EXPECT_EQ(max_abs_error(o, o_before), 0.0);
  EXPECT_EQ(max_abs_error(lse, lse_before), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Cases, KvCacheValidation, ::testing::ValuesIn(kBad),
                         [](const auto& info) { return info.param.name; });

TEST(KvCacheValidation, ConfigErrorsAtConstruction) {
  KvCacheConfig config;
  config.causal = true;
  config.window_right = 3;
  try {
    KvCacheAttention attention(config);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.argument(), "window_right") << error.what();
  }
  config = KvCacheConfig();
  config.softcap = -1.0;
  EXPECT_THROW(KvCacheAttention{config}, Error);
}

}  // namespace
}  // namespace dpa::test
