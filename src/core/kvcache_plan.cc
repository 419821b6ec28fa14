// Validation of a KV-cache call (DESIGN.md §7 for the rules, docs/kvcache.md for the contract).
#include "core/kvcache_plan.h"

#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>

#include "core/device_access.h"
#include "core/int32_tables.h"
#include "core/kvcache_splits.h"
#include "core/memory_overlap.h"

namespace dpa {
namespace {

std::string str(int64_t value) { return std::to_string(value); }

std::string where(const TensorView& t) {
  return t.device == Device::kCPU ? std::string("the host")
                                  : "CUDA device " + std::to_string(t.device_index);
}

void require_device_of(const TensorView& t, const char* name, const TensorView& q) {
  require(!t.defined() || (t.device == q.device && t.device_index == q.device_index), name, [&] {
    return "is on " + where(t) + ", q on " + where(q) + " (every tensor of the call on one device)";
  });
}

void refuse(bool condition, const char* name, const std::string& why) {
  if (!condition) throw Error(ErrorCode::kNotSupported, name, why);
}

void require_int32(const TensorView& t, const char* name, int ndim) {
  require(t.ndim == ndim, name, [&] {
    return "must be a " + str(ndim) + "-D int32 tensor, got " + str(t.ndim) + "-D " +
           t.shape_string();
  });
  require(t.dtype == DType::kInt32, name,
          [&] { return "must be int32, got " + std::string(to_string(t.dtype)); });
  for (int d = 0; d < t.ndim; ++d)
    require(t.shape[size_t(d)] >= 0, name,
            [&] { return "has a negative extent in " + t.shape_string(); });
}

// A sequence table [b + 1]: starts at 0, non-decreasing, ends within `rows`; returns lengths.
void require_boundaries_shape(const TensorView& t, const char* name, int64_t batch) {
  require_int32(t, name, 1);
  require(t.shape[0] == batch + 1, name, [&] {
    return "must have b + 1 = " + str(batch + 1) + " entries, got " + str(t.shape[0]);
  });
}

std::vector<int64_t> read_boundaries(const TensorView& t, const char* name, int64_t rows,
                                     const char* rows_name, std::vector<int64_t>* starts,
                                     void* stream) {
  const std::vector<int64_t> cu = read_int32_vector(t, stream);
  std::vector<int64_t> lengths = lengths_from_cu(cu, name);
  starts->assign(cu.begin(), cu.end() - 1);
  require(cu.back() <= rows, name, [&] {
    return "ends at row " + str(cu.back()) + " beyond the " + str(rows) + " rows of " + rows_name;
  });
  return lengths;
}

void require_disjoint(const TensorView& a, const char* a_name, const TensorView& b,
                      const char* b_name) {
  require(!byte_range(a).intersects(byte_range(b)), a_name,
          [&] { return std::string("overlaps ") + b_name + " in memory"; });
}

void require_rows_contiguous(const TensorView& t, const char* name) {
  require(t.shape[size_t(t.ndim - 1)] <= 1 || t.strides[size_t(t.ndim - 1)] == 1, name, [&] {
    return "must be contiguous in its last dimension (the head dim), got strides of " +
           t.shape_string();
  });
}

// k_new / v_new against the cache: [b, s_new, G, d] or packed [t_new, G, d].
void check_new(const TensorView& t, const char* name, const TensorView& cache, int64_t batch,
               bool packed, DType dtype) {
  require(t.ndim == (packed ? 3 : 4), name, [&] {
    return packed ? "must be [t_new, G, d] with cu_seqlens_k_new, got " + t.shape_string()
                  : "must be [b, s_new, G, d] (or [t_new, G, d] with cu_seqlens_k_new), got " +
                        t.shape_string();
  });
  for (int d = 0; d < t.ndim; ++d)
    require(t.shape[size_t(d)] >= 0, name,
            [&] { return "has a negative extent in " + t.shape_string(); });
  require(t.dtype == dtype, name, [&] {
    return "must have q's dtype " + std::string(to_string(dtype)) + ", got " +
           std::string(to_string(t.dtype));
  });
  if (!packed)
    require(t.shape[0] == batch, name,
            [&] { return "batch size " + str(t.shape[0]) + " differs from q's " + str(batch); });
  const int heads = t.ndim - 2;
  require(t.shape[size_t(heads)] == cache.shape[2], name, [&] {
    return "has " + str(t.shape[size_t(heads)]) + " KV heads, the cache " + str(cache.shape[2]);
  });
  require(t.shape[size_t(heads + 1)] == cache.shape[3], name, [&] {
    return "has head dim " + str(t.shape[size_t(heads + 1)]) + ", the cache " + str(cache.shape[3]);
  });
  require_rows_contiguous(t, name);
}

bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// A run of consecutive positions of one sequence that lie in one page.
struct PageRun {
  int64_t sequence, first_position, first_row, rows;
};

// Calls visit(page, run) for the runs that positions [begin, end) of sequence i make.
template <typename Visit>
void for_each_page_run(const KvCachePlan& plan, int64_t i, int64_t begin, int64_t end,
                       Visit&& visit) {
  for (int64_t pos = begin; pos < end;) {
    int64_t page = 0, row = 0;
    plan.slot(i, pos, &page, &row);
    const int64_t rows = std::min(end - pos, plan.page_size - row);
    visit(page, PageRun{i, pos, row, rows});
    pos += rows;
  }
}

// The first position of `a` whose row `b` also covers, or -1.
int64_t shared_position(const PageRun& a, const PageRun& b) {
  const int64_t first = std::max(a.first_row, b.first_row);
  const int64_t last = std::min(a.first_row + a.rows, b.first_row + b.rows);
  return first < last ? a.first_position + (first - a.first_row) : -1;
}

// Paged caches: no slot written twice, and no slot that one sequence's append writes is read
// at another position (a page shared between sequences, or listed twice in one table). Checked
// run by run, so a decode step costs a lookup per page, not per key.
void check_slots(const KvCachePlan& plan) {
  std::unordered_map<int64_t, std::vector<PageRun>> writes;  // page -> the runs appended to it
  for (int64_t i = 0; i < plan.batch; ++i)
    for_each_page_run(
        plan, i, plan.cached[size_t(i)], plan.keys(i), [&](int64_t page, const PageRun& run) {
          for (const PageRun& other : writes[page]) {
            const int64_t pos = shared_position(run, other);
            require(pos < 0, "block_table", [&] {
              return "maps position " + str(pos) + " of sequence " + str(i) +
                     " onto the cache slot that position " + str(shared_position(other, run)) +
                     " of sequence " + str(other.sequence) + " also appends to";
            });
          }
          writes[page].push_back(run);
        });
  if (writes.empty()) return;
  for (int64_t i = 0; i < plan.batch; ++i)
    for_each_page_run(plan, i, 0, plan.cached[size_t(i)], [&](int64_t page, const PageRun& run) {
      auto it = writes.find(page);
      if (it == writes.end()) return;
      for (const PageRun& written : it->second) {
        const int64_t pos = shared_position(run, written);
        require(pos < 0, "block_table", [&] {
          return "maps position " + str(pos) + " of sequence " + str(i) +
                 " onto a cache slot that this call's append writes (position " +
                 str(shared_position(written, run)) + " of sequence " + str(written.sequence) + ")";
        });
      }
    });
}

// The entries [i, 0, used) of a block table, from the host or the device.
std::vector<int32_t> table_row(const TensorView& table, int64_t i, int64_t used, void* stream) {
  std::vector<int32_t> row(static_cast<size_t>(used));
  const int32_t* data = static_cast<const int32_t*>(table.data) + i * table.strides[0];
  if (table.device == Device::kCPU) {
    for (int64_t p = 0; p < used; ++p) row[size_t(p)] = data[p * table.strides[1]];
  } else if (used > 0) {  // rows are contiguous on the device (check_device_call)
    device_access()->copy_to_host(row.data(), data, size_t(used) * sizeof(int32_t), stream);
  }
  return row;
}

// The tables' contents: lengths within the capacity, every used page inside the pool, and no
// cache slot both written and read twice.
void read_tables(const KvCacheArgs& a, KvCachePlan& plan) {
  const int64_t b = plan.batch;
  plan.cached = read_int32_vector(a.cache_seqlens, a.stream);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t cached = plan.cached[size_t(i)];
    require(cached >= 0, "cache_seqlens",
            [&] { return "entry " + str(i) + " is " + str(cached) + " (lengths are >= 0)"; });
    require(plan.keys(i) <= std::numeric_limits<int32_t>::max(), "cache_seqlens", [&] {
      return "entry " + str(i) + " and the append give " + str(plan.keys(i)) +
             " keys, beyond int32 positions";
    });
    require(plan.keys(i) <= plan.capacity, "cache_seqlens", [&] {
      return "entry " + str(i) + " holds " + str(cached) + " tokens and the call appends " +
             str(plan.added[size_t(i)]) + ", beyond the cache's capacity of " + str(plan.capacity) +
             " positions per sequence";
    });
  }
  if (!plan.paged) return;
  // Only the pages that hold keys are read, and only they are kept (a table may be far larger
  // than what the sequences use).
  const int64_t num_pages = a.k_cache.shape[0];
  plan.first_page.assign(size_t(b), 0);
  for (int64_t i = 0; i < b; ++i) {
    plan.first_page[size_t(i)] = int64_t(plan.pages.size());
    const int64_t used = (plan.keys(i) + plan.page_size - 1) / plan.page_size;
    const std::vector<int32_t> row = table_row(a.block_table, i, used, a.stream);
    for (int64_t p = 0; p < used; ++p) {
      const int64_t page = row[size_t(p)];
      require(page >= 0 && page < num_pages, "block_table", [&] {
        return "entry [" + str(i) + ", " + str(p) + "] is page " + str(page) +
               ", outside the pool of " + str(num_pages) + " pages";
      });
      plan.pages.push_back(page);
    }
  }
  check_slots(plan);
}

// The head dim, extents and tensors the attention reads or writes (the host path's ordinary call
// checks these for itself): o like q with dv, the LSE fp32 [b, H, sq] / [H, tq], the slopes
// fp32 [H] / [b, H], the sinks fp32 [H] exactly with learnable sinks.
void check_outputs_and_features(const KvCachePlan& plan, const KvCacheArgs& a,
                                const KvCacheConfig& config) {
  std::vector<int64_t> o_shape(a.q.shape.begin(), a.q.shape.begin() + a.q.ndim);
  o_shape.back() = plan.head_dim_v;
  require(a.o.ndim == a.q.ndim && std::equal(o_shape.begin(), o_shape.end(), a.o.shape.begin()),
          "o", [&] {
            return "must be q's shape with v's head dim " + str(plan.head_dim_v) + ", got " +
                   a.o.shape_string();
          });
  require(a.o.dtype == a.q.dtype, "o", [&] {
    return "must have q's dtype " + std::string(to_string(a.q.dtype)) + ", got " +
           std::string(to_string(a.o.dtype));
  });
  require_rows_contiguous(a.o, "o");
  auto require_fp32_contiguous = [](const TensorView& t, const char* name) {
    require(t.dtype == DType::kFloat32, name,
            [&] { return "must be float32, got " + std::string(to_string(t.dtype)); });
    require(t.is_contiguous(), name, "must be contiguous");
  };
  if (a.lse.defined()) {
    require_fp32_contiguous(a.lse, "lse");
    const bool fits =
        plan.packed_q
            ? a.lse.ndim == 2 && a.lse.shape[0] == plan.heads_q && a.lse.shape[1] == a.q.shape[0]
            : a.lse.ndim == 3 && a.lse.shape[0] == plan.batch && a.lse.shape[1] == plan.heads_q &&
                  a.lse.shape[2] == a.q.shape[1];
    require(fits, "lse", [&] {
      return std::string("must be ") + (plan.packed_q ? "[H, tq]" : "[b, H, sq]") + ", got " +
             a.lse.shape_string();
    });
  }
  if (a.alibi_slopes.defined()) {
    require_fp32_contiguous(a.alibi_slopes, "alibi_slopes");
    const TensorView& t = a.alibi_slopes;
    require((t.ndim == 1 && t.shape[0] == plan.heads_q) ||
                (t.ndim == 2 && t.shape[0] == plan.batch && t.shape[1] == plan.heads_q),
            "alibi_slopes", [&] {
              return "must be [H] or [b, H] with H = " + str(plan.heads_q) + ", got " +
                     t.shape_string();
            });
  }
  const bool learnable = config.softmax_type == SoftmaxType::kLearnable;
  require(a.softmax_offset.defined() == learnable, "softmax_offset",
          learnable ? "is required with softmax_type learnable"
                    : "is given but softmax_type is not learnable");
  if (learnable) {
    require_fp32_contiguous(a.softmax_offset, "softmax_offset");
    require(a.softmax_offset.ndim == 1 && a.softmax_offset.shape[0] == plan.heads_q,
            "softmax_offset", [&] {
              return "must be [H] with H = " + str(plan.heads_q) + ", got " +
                     a.softmax_offset.shape_string();
            });
  }
}

// Rows the kernels copy in 16-byte chunks: an aligned base and element strides that keep every
// row aligned.
bool rows_16_byte_aligned(const TensorView& t) {
  if (!t.defined() || t.numel() == 0) return true;
  const size_t element = dtype_size(t.dtype);
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  for (int d = 0; d + 1 < t.ndim; ++d)
    if (t.shape[size_t(d)] > 1 && (size_t(t.strides[size_t(d)]) * element) % 16 != 0) return false;
  return (size_t(t.shape[size_t(t.ndim - 1)]) * element) % 16 == 0;
}

// What the device kernels take (docs/kvcache.md): refused with kNotSupported otherwise.
void check_device_call(const KvCachePlan& plan, const KvCacheArgs& a, const KvCacheConfig& config) {
  const DeviceAccess* device = device_access();
  refuse(device != nullptr, "q", "is a device tensor, and this build has no CUDA support");
  const int arch = device->arch(plan.device_index);
  refuse(arch != 0, "q", "is on CUDA device " + str(plan.device_index) + ", which is not present");
  refuse(arch >= 80, "q", "is on a device older than sm_80, which the KV-cache kernels need");
  refuse(a.q.dtype == DType::kFloat16 || a.q.dtype == DType::kBFloat16, "q",
         "is " + std::string(to_string(a.q.dtype)) +
             ": the device KV-cache kernels take float16 and bfloat16");
  refuse(plan.head_dim_v == plan.head_dim_qk, "v_cache",
         "has head dim " + str(plan.head_dim_v) + " and k_cache " + str(plan.head_dim_qk) +
             ": the device KV-cache kernels take equal head dims");
  refuse(kvcache_device_head_dim(plan.head_dim_qk), "q",
         "has head dim " + str(plan.head_dim_qk) +
             ": the device KV-cache kernels take head dims 64, 128 and 256");
  refuse(a.q.shape[size_t(a.q.ndim - 1)] <= 1 || a.q.strides[size_t(a.q.ndim - 1)] == 1, "q",
         "must be contiguous in its head dim on the device (the kernels copy rows in 16-byte "
         "chunks)");
  // The kernels' positions are int: a finite window beyond 2^30 could overflow them.
  constexpr int64_t kWindowLimit = int64_t(1) << 30;
  for (const auto& [bound, name] : {std::make_pair(config.window_left, "window_left"),
                                    std::make_pair(config.window_right, "window_right")})
    refuse(bound < kWindowLimit, name,
           "is " + str(bound) +
               ": a finite window beyond 2^30 positions, which the device KV-cache kernels do not "
               "take (pass -1 for an unbounded side)");
  refuse(plan.batch <= 65535, "cache_seqlens",
         "has " + str(plan.batch) + " sequences: the device KV-cache kernels take up to 65535");
  for (const auto& [t, name] :
       {std::make_pair(&a.q, "q"), std::make_pair(&a.o, "o"), std::make_pair(&a.k_cache, "k_cache"),
        std::make_pair(&a.v_cache, "v_cache"), std::make_pair(&a.k_new, "k_new"),
        std::make_pair(&a.v_new, "v_new")})
    refuse(rows_16_byte_aligned(*t), name,
           "has rows that do not start on 16-byte boundaries (base pointer and strides), which "
           "the device KV-cache kernels copy in 16-byte chunks");
  for (const auto& [t, name] : {std::make_pair(&a.cache_seqlens, "cache_seqlens"),
                                std::make_pair(&a.cu_seqlens_q, "cu_seqlens_q"),
                                std::make_pair(&a.cu_seqlens_k_new, "cu_seqlens_k_new")})
    refuse(!t->defined() || t->numel() <= 1 || t->strides[0] == 1, name,
           "must be contiguous on the device");
  refuse(!plan.paged || a.block_table.shape[1] <= 1 || a.block_table.strides[1] == 1, "block_table",
         "must be contiguous in its last dimension on the device");
  check_outputs_and_features(plan, a, config);
}

}  // namespace

int64_t KvCachePlan::max_keys() const {
  int64_t most = 0;
  for (int64_t i = 0; i < batch; ++i) most = std::max(most, keys(i));
  return most;
}

void KvCachePlan::slot(int64_t i, int64_t pos, int64_t* dim0, int64_t* dim1) const {
  if (!paged) {
    *dim0 = i;
    *dim1 = pos;
    return;
  }
  *dim0 = pages[size_t(first_page[size_t(i)] + pos / page_size)];
  *dim1 = pos % page_size;
}

KvCachePlan plan_kvcache(const KvCacheArgs& a, const KvCacheConfig& config) {
  const std::pair<const TensorView*, const char*> tensors[] = {
      {&a.q, "q"},
      {&a.cu_seqlens_q, "cu_seqlens_q"},
      {&a.k_cache, "k_cache"},
      {&a.v_cache, "v_cache"},
      {&a.block_table, "block_table"},
      {&a.cache_seqlens, "cache_seqlens"},
      {&a.k_new, "k_new"},
      {&a.v_new, "v_new"},
      {&a.cu_seqlens_k_new, "cu_seqlens_k_new"},
      {&a.alibi_slopes, "alibi_slopes"},
      {&a.softmax_offset, "softmax_offset"},
      {&a.o, "o"},
      {&a.lse, "lse"}};
  require(a.q.defined(), "q", "is required");
  for (const auto& [t, name] : tensors) {
    require_device_of(*t, name, a.q);
    require(!t->defined() || t->data != nullptr || t->numel() == 0, name,
            "has elements but no data pointer");
  }

  KvCachePlan plan;
  plan.device = a.q.device;
  plan.device_index = a.q.device_index;
  plan.tables_read = plan.device == Device::kCPU || config.check_tables;
  require(a.q.ndim == 3 || a.q.ndim == 4, "q", [&] {
    return "must be [b, sq, H, d] or [tq, H, d] with cu_seqlens_q, got " + a.q.shape_string();
  });
  for (int d = 0; d < a.q.ndim; ++d)
    require(a.q.shape[size_t(d)] >= 0, "q",
            [&] { return "has a negative extent in " + a.q.shape_string(); });
  require(is_floating(a.q.dtype), "q", "must be a floating-point tensor");
  plan.packed_q = a.q.ndim == 3;
  require(plan.packed_q == a.cu_seqlens_q.defined(), "cu_seqlens_q",
          plan.packed_q ? "is required with a packed [tq, H, d] q"
                        : "is given with a 4-D q (pass q packed as [tq, H, d] for varlen queries)");
  plan.heads_q = a.q.shape[size_t(a.q.ndim - 2)];
  plan.head_dim_qk = a.q.shape[size_t(a.q.ndim - 1)];
  if (plan.packed_q) {
    require_int32(a.cu_seqlens_q, "cu_seqlens_q", 1);
    require(a.cu_seqlens_q.shape[0] >= 1, "cu_seqlens_q", "must have b + 1 >= 1 entries");
  }
  void* const stream = a.stream;
  plan.batch = plan.packed_q ? a.cu_seqlens_q.shape[0] - 1 : a.q.shape[0];
  const int64_t b = plan.batch;

  // The cache.
  for (const auto& [cache, name] :
       {std::make_pair(&a.k_cache, "k_cache"), std::make_pair(&a.v_cache, "v_cache")}) {
    const TensorView* t = cache;  // a lambda may not capture a structured binding (clang 14)
    require(t->defined(), name, "is required");
    require(t->ndim == 4, name, [&] {
      return "must be [b, s_max, G, d] or paged [num_pages, page_size, G, d], got " +
             t->shape_string();
    });
    for (int d = 0; d < 4; ++d)
      require(t->shape[size_t(d)] >= 0, name,
              [&] { return "has a negative extent in " + t->shape_string(); });
    require(t->dtype == a.q.dtype, name, [&] {
      return "must have q's dtype " + std::string(to_string(a.q.dtype)) + ", got " +
             std::string(to_string(t->dtype));
    });
    require_rows_contiguous(*t, name);
  }
  for (int d = 0; d < 3; ++d)
    require(a.v_cache.shape[size_t(d)] == a.k_cache.shape[size_t(d)], "v_cache", [&] {
      return "must match k_cache in its first three dimensions: " + a.v_cache.shape_string() +
             " against " + a.k_cache.shape_string();
    });
  plan.heads_kv = a.k_cache.shape[2];
  plan.head_dim_v = a.v_cache.shape[3];
  require(a.k_cache.shape[3] == plan.head_dim_qk, "k_cache", [&] {
    return "has head dim " + str(a.k_cache.shape[3]) + ", q " + str(plan.head_dim_qk);
  });
  require(plan.heads_kv > 0 && plan.heads_q % plan.heads_kv == 0, "k_cache", [&] {
    return "has " + str(plan.heads_kv) + " KV heads, which must divide q's " + str(plan.heads_q);
  });

  require(a.cache_seqlens.defined(), "cache_seqlens", "is required (int32 [b])");
  require_int32(a.cache_seqlens, "cache_seqlens", 1);
  require(a.cache_seqlens.shape[0] == b, "cache_seqlens", [&] {
    return "must have b = " + str(b) + " entries, got " + str(a.cache_seqlens.shape[0]);
  });

  plan.paged = a.block_table.defined();
  if (plan.paged) {
    require_int32(a.block_table, "block_table", 2);
    require(a.block_table.shape[0] == b, "block_table", [&] {
      return "must have b = " + str(b) + " rows, got " + a.block_table.shape_string();
    });
    plan.page_size = a.k_cache.shape[1];
    require(is_power_of_two(plan.page_size) && plan.page_size <= 256, "k_cache", [&] {
      return "has page size " + str(plan.page_size) +
             " (dimension 1 of a paged cache), which must be a power of two from 1 to 256";
    });
    // Positions are int32 (cache_seqlens): a longer table adds no capacity.
    const int64_t max_pages = a.block_table.shape[1];
    plan.capacity =
        std::min<int64_t>(max_pages, std::numeric_limits<int32_t>::max()) * plan.page_size;
  } else {
    require(a.k_cache.shape[0] == b, "k_cache", [&] {
      return "has batch size " + str(a.k_cache.shape[0]) + ", q " + str(b) +
             " (pass block_table for a paged cache)";
    });
    plan.capacity = a.k_cache.shape[1];
  }

  // The append.
  require(a.k_new.defined() == a.v_new.defined(), a.k_new.defined() ? "v_new" : "k_new",
          "is required with the other (k_new and v_new come together)");
  plan.packed_new = a.k_new.defined() && a.k_new.ndim == 3;
  require(!a.cu_seqlens_k_new.defined() || plan.packed_new, "cu_seqlens_k_new",
          "is given without packed [t_new, G, d] k_new / v_new");
  plan.added.assign(size_t(b), 0);
  plan.new_start.assign(size_t(b), 0);
  if (a.k_new.defined()) {
    check_new(a.k_new, "k_new", a.k_cache, b, plan.packed_new, a.q.dtype);
    check_new(a.v_new, "v_new", a.v_cache, b, plan.packed_new, a.q.dtype);
    require(a.v_new.shape[0] == a.k_new.shape[0] &&
                (plan.packed_new || a.v_new.shape[1] == a.k_new.shape[1]),
            "v_new", [&] {
              return "must have k_new's rows: " + a.v_new.shape_string() + " against " +
                     a.k_new.shape_string();
            });
    if (plan.packed_new) {
      require(a.cu_seqlens_k_new.defined(), "cu_seqlens_k_new",
              "is required with packed [t_new, G, d] k_new / v_new");
      require_boundaries_shape(a.cu_seqlens_k_new, "cu_seqlens_k_new", b);
      if (plan.tables_read)
        plan.added = read_boundaries(a.cu_seqlens_k_new, "cu_seqlens_k_new", a.k_new.shape[0],
                                     "k_new", &plan.new_start, stream);
    } else {
      plan.added.assign(size_t(b), a.k_new.shape[1]);
    }
    for (const auto& [fresh, fresh_name] :
         {std::make_pair(&a.k_new, "k_new"), std::make_pair(&a.v_new, "v_new")}) {
      require_disjoint(*fresh, fresh_name, a.k_cache, "k_cache");
      require_disjoint(*fresh, fresh_name, a.v_cache, "v_cache");
    }
  }

  // Queries.
  if (plan.packed_q) {
    require_boundaries_shape(a.cu_seqlens_q, "cu_seqlens_q", b);
    if (plan.tables_read)
      plan.q_len =
          read_boundaries(a.cu_seqlens_q, "cu_seqlens_q", a.q.shape[0], "q", &plan.q_start, stream);
  } else {
    plan.q_len.assign(size_t(b), a.q.shape[1]);
    plan.q_start.assign(size_t(b), 0);
  }
  require(a.o.defined(), "o", "is required");
  for (const auto& [t, name] :
       {std::make_pair(&a.k_cache, "k_cache"), std::make_pair(&a.v_cache, "v_cache"),
        std::make_pair(&a.k_new, "k_new"), std::make_pair(&a.v_new, "v_new")})
    require_disjoint(a.o, "o", *t, name);
  // What the call reads after the append, or writes, must not be the cache. (k_cache and
  // v_cache may interleave, as halves of one [.., 2, G, d] tensor, but not be one tensor when
  // the append writes both.)
  for (const auto& [t, name] : {std::make_pair(&a.q, "q"), std::make_pair(&a.lse, "lse"),
                                std::make_pair(&a.alibi_slopes, "alibi_slopes"),
                                std::make_pair(&a.softmax_offset, "softmax_offset")}) {
    require_disjoint(*t, name, a.k_cache, "k_cache");
    require_disjoint(*t, name, a.v_cache, "v_cache");
  }
  require(!a.k_new.defined() || a.k_cache.data != a.v_cache.data ||
              a.k_cache.strides != a.v_cache.strides,
          "v_cache", "is k_cache itself: the append of v_new would overwrite k_new's");
  // o and lse apart from what the call reads and from each other, and nothing the call writes
  // with repeated elements (core/memory_overlap.h: the cases the views prove).
  for (const auto& [t, name] :
       {std::make_pair(&a.q, "q"), std::make_pair(&a.cu_seqlens_q, "cu_seqlens_q"),
        std::make_pair(&a.cache_seqlens, "cache_seqlens"),
        std::make_pair(&a.block_table, "block_table"),
        std::make_pair(&a.cu_seqlens_k_new, "cu_seqlens_k_new"),
        std::make_pair(&a.alibi_slopes, "alibi_slopes"),
        std::make_pair(&a.softmax_offset, "softmax_offset")}) {
    require_apart(a.o, "o", *t, name);
    require_apart(a.lse, "lse", *t, name);
  }
  require_apart(a.lse, "lse", a.o, "o");
  require_no_repeated_elements(a.o, "o");
  require_no_repeated_elements(a.lse, "lse");
  if (a.k_new.defined()) {
    require_no_repeated_elements(a.k_cache, "k_cache");
    require_no_repeated_elements(a.v_cache, "v_cache");
  }
  const NamedView read_or_written[] = {{&a.q, "q"},
                                       {&a.k_cache, "k_cache"},
                                       {&a.v_cache, "v_cache"},
                                       {&a.k_new, "k_new"},
                                       {&a.v_new, "v_new"},
                                       {&a.block_table, "block_table"},
                                       {&a.cache_seqlens, "cache_seqlens"},
                                       {&a.cu_seqlens_q, "cu_seqlens_q"},
                                       {&a.cu_seqlens_k_new, "cu_seqlens_k_new"},
                                       {&a.alibi_slopes, "alibi_slopes"},
                                       {&a.softmax_offset, "softmax_offset"},
                                       {&a.o, "o"},
                                       {&a.lse, "lse"}};
  require_workspace_apart(a.workspace, read_or_written);

  if (plan.device == Device::kCUDA) check_device_call(plan, a, config);
  if (plan.tables_read) read_tables(a, plan);
  return plan;
}

}  // namespace dpa
