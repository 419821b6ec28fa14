#include "support/cp_case.h"

namespace dpa::test {

std::vector<int64_t> cp_local_shape(std::vector<int64_t> full, Format format, int cp,
                                    const ThdCpPartition& partition) {
  if (format == Format::kBSHD) full[1] /= cp;
  if (format == Format::kSBHD) full[0] /= cp;
  if (format == Format::kTHD) full[0] = partition.local_cu_padded.back();
  return full;
}

void pad_thd_for_cp(CaseSpec& spec, int cp) {
  if (spec.config.format != Format::kTHD) return;
  const ThdCpPartition partition = thd_cp_partition(spec.lengths_q, cp);
  spec.gaps_q.clear();
  for (size_t b = 0; b < spec.lengths_q.size(); ++b)
    spec.gaps_q.push_back(partition.cu_seqlens_padded[b + 1] - partition.cu_seqlens_padded[b] -
                          spec.lengths_q[b]);
  spec.gaps_kv = spec.gaps_q;
}

std::string cp_layout_name(const CpLayout& layout) {
  std::string name = std::string(to_string(layout.type)) + "_cp" + std::to_string(layout.cp);
  if (layout.type == CpCommType::kA2AP2P) name += "_a2a" + std::to_string(layout.group);
  return name;
}

HostTensor sum_of(const std::vector<HostTensor>& partials) {
  HostTensor sum(partials[0].dtype(), partials[0].shape());
  for (int64_t n = 0; n < sum.numel(); ++n) {
    double total = 0;
    for (const HostTensor& partial : partials) total += partial.get(n);
    sum.set(n, total);
  }
  return sum;
}

}  // namespace dpa::test
