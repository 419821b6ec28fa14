// Shared pieces of the context-parallel suites (host: test_cp_attention.cc, GPU:
// gpu/test_gpu_cp.cc): shard shapes, the thd padding of the unsharded reference, layouts, and
// the sum of the ranks' partial gradients.
#pragma once

#include <string>
#include <vector>

#include "dpa/cp.h"
#include "support/attention_case.h"

namespace dpa::test {

// A rank's shard shape of an unsharded q/k/v/o-like tensor.
std::vector<int64_t> cp_local_shape(std::vector<int64_t> full, Format format, int cp,
                                    const ThdCpPartition& partition);

// thd: the unsharded reference stores each sequence in its padded slot (gaps), as CP does.
void pad_thd_for_cp(CaseSpec& spec, int cp);

struct CpLayout {
  CpCommType type;
  int cp;
  int group;  // a2a_p2p: ranks per all-to-all group
};
std::string cp_layout_name(const CpLayout& layout);  // e.g. "a2a_p2p_cp4_a2a2"

// The elementwise sum of the ranks' partial gradients (the dalpha and dbias contracts).
HostTensor sum_of(const std::vector<HostTensor>& partials);

}  // namespace dpa::test
