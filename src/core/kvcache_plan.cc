// Validation of a KV-cache call (DESIGN.md §7 for the rules, docs/kvcache.md for the contract).
#include "core/kvcache_plan.h"

#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>

#include "core/int32_tables.h"

namespace dpa {
namespace {

std::string str(int64_t value) { return std::to_string(value); }

void require_host(const TensorView& t, const char* name) {
  if (t.defined() && t.device != Device::kCPU)
    throw Error(ErrorCode::kNotSupported, name,
                "is a device tensor: attention_with_kvcache runs on host tensors only (the "
                "device serving kernels are not built yet)");
}

void require_int32(const TensorView& t, const char* name, int ndim) {
  require(
      t.ndim == ndim, name,
      "must be a " + str(ndim) + "-D int32 tensor, got " + str(t.ndim) + "-D " + t.shape_string());
  require(t.dtype == DType::kInt32, name, "must be int32, got " + std::string(to_string(t.dtype)));
  for (int d = 0; d < t.ndim; ++d)
    require(t.shape[size_t(d)] >= 0, name, "has a negative extent in " + t.shape_string());
}

// A sequence table [b + 1]: starts at 0, non-decreasing, ends within `rows`; returns lengths.
std::vector<int64_t> read_boundaries(const TensorView& t, const char* name, int64_t batch,
                                     int64_t rows, const char* rows_name,
                                     std::vector<int64_t>* starts) {
  require_int32(t, name, 1);
  require(t.shape[0] == batch + 1, name,
          "must have b + 1 = " + str(batch + 1) + " entries, got " + str(t.shape[0]));
  const std::vector<int64_t> cu = read_int32_vector(t, nullptr);  // host tensors only
  std::vector<int64_t> lengths = lengths_from_cu(cu, name);
  starts->assign(cu.begin(), cu.end() - 1);
  require(cu.back() <= rows, name,
          "ends at row " + str(cu.back()) + " beyond the " + str(rows) + " rows of " + rows_name);
  return lengths;
}

// The byte range a strided tensor spans ([begin, end); empty when it has no element).
struct ByteRange {
  uintptr_t begin = 0, end = 0;
};

ByteRange byte_range(const TensorView& t) {
  if (!t.defined() || t.data == nullptr) return {};
  int64_t last = 0;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[size_t(d)] == 0) return {};
    last += (t.shape[size_t(d)] - 1) * t.strides[size_t(d)];
  }
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data);
  return {begin, begin + uintptr_t(last + 1) * dtype_size(t.dtype)};
}

void require_disjoint(const TensorView& a, const char* a_name, const TensorView& b,
                      const char* b_name) {
  const ByteRange x = byte_range(a), y = byte_range(b);
  const bool overlap = x.begin < x.end && y.begin < y.end && x.begin < y.end && y.begin < x.end;
  require(!overlap, a_name, std::string("overlaps ") + b_name + " in memory");
}

void require_rows_contiguous(const TensorView& t, const char* name) {
  require(t.shape[size_t(t.ndim - 1)] <= 1 || t.strides[size_t(t.ndim - 1)] == 1, name,
          "must be contiguous in its last dimension (the head dim), got strides of " +
              t.shape_string());
}

// k_new / v_new against the cache: [b, s_new, G, d] or packed [t_new, G, d].
void check_new(const TensorView& t, const char* name, const TensorView& cache, int64_t batch,
               bool packed, DType dtype) {
  require(t.ndim == (packed ? 3 : 4), name,
          packed ? "must be [t_new, G, d] with cu_seqlens_k_new, got " + t.shape_string()
                 : "must be [b, s_new, G, d] (or [t_new, G, d] with cu_seqlens_k_new), got " +
                       t.shape_string());
  for (int d = 0; d < t.ndim; ++d)
    require(t.shape[size_t(d)] >= 0, name, "has a negative extent in " + t.shape_string());
  require(t.dtype == dtype, name,
          "must have q's dtype " + std::string(to_string(dtype)) + ", got " +
              std::string(to_string(t.dtype)));
  if (!packed)
    require(t.shape[0] == batch, name,
            "batch size " + str(t.shape[0]) + " differs from q's " + str(batch));
  const int heads = t.ndim - 2;
  require(t.shape[size_t(heads)] == cache.shape[2], name,
          "has " + str(t.shape[size_t(heads)]) + " KV heads, the cache " + str(cache.shape[2]));
  require(t.shape[size_t(heads + 1)] == cache.shape[3], name,
          "has head dim " + str(t.shape[size_t(heads + 1)]) + ", the cache " + str(cache.shape[3]));
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
            require(pos < 0, "block_table",
                    "maps position " + str(pos) + " of sequence " + str(i) +
                        " onto the cache slot that position " + str(shared_position(other, run)) +
                        " of sequence " + str(other.sequence) + " also appends to");
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
        require(pos < 0, "block_table",
                "maps position " + str(pos) + " of sequence " + str(i) +
                    " onto a cache slot that this call's append writes (position " +
                    str(shared_position(written, run)) + " of sequence " + str(written.sequence) +
                    ")");
      }
    });
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

KvCachePlan plan_kvcache(const KvCacheArgs& a) {
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
  for (const auto& [t, name] : tensors) {
    require_host(*t, name);
    require(!t->defined() || t->data != nullptr || t->numel() == 0, name,
            "has elements but no data pointer");
  }

  KvCachePlan plan;
  require(a.q.defined(), "q", "is required");
  require(a.q.ndim == 3 || a.q.ndim == 4, "q",
          "must be [b, sq, H, d] or [tq, H, d] with cu_seqlens_q, got " + a.q.shape_string());
  for (int d = 0; d < a.q.ndim; ++d)
    require(a.q.shape[size_t(d)] >= 0, "q", "has a negative extent in " + a.q.shape_string());
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
  plan.batch = plan.packed_q ? a.cu_seqlens_q.shape[0] - 1 : a.q.shape[0];
  const int64_t b = plan.batch;

  // The cache.
  for (const auto& [t, name] :
       {std::make_pair(&a.k_cache, "k_cache"), std::make_pair(&a.v_cache, "v_cache")}) {
    require(t->defined(), name, "is required");
    require(
        t->ndim == 4, name,
        "must be [b, s_max, G, d] or paged [num_pages, page_size, G, d], got " + t->shape_string());
    for (int d = 0; d < 4; ++d)
      require(t->shape[size_t(d)] >= 0, name, "has a negative extent in " + t->shape_string());
    require(t->dtype == a.q.dtype, name,
            "must have q's dtype " + std::string(to_string(a.q.dtype)) + ", got " +
                std::string(to_string(t->dtype)));
    require_rows_contiguous(*t, name);
  }
  for (int d = 0; d < 3; ++d)
    require(a.v_cache.shape[size_t(d)] == a.k_cache.shape[size_t(d)], "v_cache",
            "must match k_cache in its first three dimensions: " + a.v_cache.shape_string() +
                " against " + a.k_cache.shape_string());
  plan.heads_kv = a.k_cache.shape[2];
  plan.head_dim_v = a.v_cache.shape[3];
  require(a.k_cache.shape[3] == plan.head_dim_qk, "k_cache",
          "has head dim " + str(a.k_cache.shape[3]) + ", q " + str(plan.head_dim_qk));
  require(plan.heads_kv > 0 && plan.heads_q % plan.heads_kv == 0, "k_cache",
          "has " + str(plan.heads_kv) + " KV heads, which must divide q's " + str(plan.heads_q));

  require(a.cache_seqlens.defined(), "cache_seqlens", "is required (int32 [b])");
  require_int32(a.cache_seqlens, "cache_seqlens", 1);
  require(a.cache_seqlens.shape[0] == b, "cache_seqlens",
          "must have b = " + str(b) + " entries, got " + str(a.cache_seqlens.shape[0]));

  plan.paged = a.block_table.defined();
  if (plan.paged) {
    require_int32(a.block_table, "block_table", 2);
    require(a.block_table.shape[0] == b, "block_table",
            "must have b = " + str(b) + " rows, got " + a.block_table.shape_string());
    plan.page_size = a.k_cache.shape[1];
    require(is_power_of_two(plan.page_size) && plan.page_size <= 256, "k_cache",
            "has page size " + str(plan.page_size) +
                " (dimension 1 of a paged cache), which must be a power of two from 1 to 256");
    // Positions are int32 (cache_seqlens): a longer table adds no capacity.
    const int64_t max_pages = a.block_table.shape[1];
    plan.capacity =
        std::min<int64_t>(max_pages, std::numeric_limits<int32_t>::max()) * plan.page_size;
  } else {
    require(a.k_cache.shape[0] == b, "k_cache",
            "has batch size " + str(a.k_cache.shape[0]) + ", q " + str(b) +
                " (pass block_table for a paged cache)");
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
    require(
        a.v_new.shape[0] == a.k_new.shape[0] &&
            (plan.packed_new || a.v_new.shape[1] == a.k_new.shape[1]),
        "v_new",
        "must have k_new's rows: " + a.v_new.shape_string() + " against " + a.k_new.shape_string());
    if (plan.packed_new) {
      require(a.cu_seqlens_k_new.defined(), "cu_seqlens_k_new",
              "is required with packed [t_new, G, d] k_new / v_new");
      plan.added = read_boundaries(a.cu_seqlens_k_new, "cu_seqlens_k_new", b, a.k_new.shape[0],
                                   "k_new", &plan.new_start);
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
    plan.q_len =
        read_boundaries(a.cu_seqlens_q, "cu_seqlens_q", b, a.q.shape[0], "q", &plan.q_start);
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

  // The tables' contents.
  plan.cached = read_int32_vector(a.cache_seqlens, nullptr);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t cached = plan.cached[size_t(i)];
    require(cached >= 0, "cache_seqlens",
            "entry " + str(i) + " is " + str(cached) + " (lengths are >= 0)");
    require(plan.keys(i) <= plan.capacity, "cache_seqlens",
            "entry " + str(i) + " holds " + str(cached) + " tokens and the call appends " +
                str(plan.added[size_t(i)]) + ", beyond the cache's capacity of " +
                str(plan.capacity) + " positions per sequence");
  }
  if (plan.paged) {
    // Only the pages that hold keys are read, and only they are kept (a table may be far larger
    // than what the sequences use).
    const int64_t num_pages = a.k_cache.shape[0];
    const int32_t* table = static_cast<const int32_t*>(a.block_table.data);
    plan.first_page.assign(size_t(b), 0);
    for (int64_t i = 0; i < b; ++i) {
      plan.first_page[size_t(i)] = int64_t(plan.pages.size());
      const int64_t used = (plan.keys(i) + plan.page_size - 1) / plan.page_size;
      for (int64_t p = 0; p < used; ++p) {
        const int64_t page = table[i * a.block_table.strides[0] + p * a.block_table.strides[1]];
        require(page >= 0 && page < num_pages, "block_table",
                "entry [" + str(i) + ", " + str(p) + "] is page " + str(page) +
                    ", outside the pool of " + str(num_pages) + " pages");
        plan.pages.push_back(page);
      }
    }
    check_slots(plan);
  }
  return plan;
}

}  // namespace dpa
