// libFuzzer harness for KvCacheAttention's validation (dpa/kvcache.h, core/kvcache_plan.cc): the
// bytes choose the shapes, the layout (contiguous or paged, packed queries and appends) and
// every table entry (cache_seqlens, block_table, cu_seqlens_q, cu_seqlens_k_new), any of them
// out of range. Every tensor is allocated as large as its view says and no larger, so a read or
// write the validation let through past a sequence's pages is an ASan report. The call either
// runs or throws dpa::Error; anything else is a finding. scripts/fuzz.sh runs it.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dpa/error.h"
#include "dpa/kvcache.h"
#include "fuzz_input.h"

using dpa::fuzz::boundaries;
using dpa::fuzz::Bytes;
using dpa::fuzz::floats;
using dpa::fuzz::ints;
using dpa::fuzz::Tensor;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes bytes(data, size);
  const int64_t b = bytes.below(4), G = 1 + bytes.below(2),
                H = G * (1 + bytes.below(2)) + (bytes.below(8) == 0 ? 1 : 0);
  const int64_t d = 1 + bytes.below(4), dv = 1 + bytes.below(4);
  const bool paged = bytes.below(2), packed_q = bytes.below(2), append = bytes.below(2);
  const bool packed_new = append && bytes.below(2);

  dpa::KvCacheConfig config;
  config.causal = bytes.below(2);
  config.window_left = bytes.below(6) - 1;
  config.window_right = config.causal ? -1 : bytes.below(4) - 1;
  config.softcap = bytes.below(2) ? 2.0 : 0.0;
  config.softmax_type = dpa::SoftmaxType(bytes.below(3));
  config.backend = bytes.below(2) ? dpa::BackendKind::kCpuExact : dpa::BackendKind::kCpu;

  std::vector<Tensor> keep;
  dpa::KvCacheArgs args;
  int64_t tq = 0, sq = 1 + bytes.below(3);
  if (packed_q) {
    keep.push_back(boundaries(b, bytes, &tq));
    args.cu_seqlens_q = keep.back().view;
    keep.push_back(floats({tq, H, d}, 0.5f));
  } else {
    keep.push_back(floats({b, sq, H, d}, 0.5f));
  }
  args.q = keep.back().view;
  if (paged) {
    const int64_t page_size = 1 + bytes.below(4), pages = bytes.below(8),
                  max_pages = bytes.below(4);
    keep.push_back(floats({pages, page_size, G, d}, 1.0f));
    args.k_cache = keep.back().view;
    keep.push_back(floats({pages, page_size, G, dv}, 1.0f));
    args.v_cache = keep.back().view;
    keep.push_back(ints({b, max_pages}, bytes));
    args.block_table = keep.back().view;
  } else {
    const int64_t s_max = bytes.below(12);
    keep.push_back(floats({b, s_max, G, d}, 1.0f));
    args.k_cache = keep.back().view;
    keep.push_back(floats({b, s_max, G, dv}, 1.0f));
    args.v_cache = keep.back().view;
  }
  keep.push_back(ints({b}, bytes));
  args.cache_seqlens = keep.back().view;
  if (append) {
    int64_t rows = bytes.below(4);
    if (packed_new) {
      keep.push_back(boundaries(b, bytes, &rows));
      args.cu_seqlens_k_new = keep.back().view;
      keep.push_back(floats({rows, G, d}, 2.0f));
      args.k_new = keep.back().view;
      keep.push_back(floats({rows, G, dv}, 2.0f));
    } else {
      keep.push_back(floats({b, rows, G, d}, 2.0f));
      args.k_new = keep.back().view;
      keep.push_back(floats({b, rows, G, dv}, 2.0f));
    }
    args.v_new = keep.back().view;
  }
  if (config.softmax_type == dpa::SoftmaxType::kLearnable) {
    keep.push_back(floats({H}, 0.25f));
    args.softmax_offset = keep.back().view;
  }
  keep.push_back(floats(
      packed_q ? std::vector<int64_t>{tq, H, dv} : std::vector<int64_t>{b, sq, H, dv}, 0.0f));
  args.o = keep.back().view;
  if (bytes.below(2)) {
    keep.push_back(
        floats(packed_q ? std::vector<int64_t>{H, tq} : std::vector<int64_t>{b, H, sq}, 0.0f));
    args.lse = keep.back().view;
  }
  try {
    dpa::KvCacheAttention(config).forward(args);
  } catch (const dpa::Error&) {
  }
  return 0;
}
