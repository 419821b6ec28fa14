#include "cuda/sequence_tables.h"

#include <vector>

namespace dpa::cuda {

SequenceTables upload_sequence_tables(const AttentionProblem& p, cudaStream_t stream) {
  const size_t batch = size_t(p.batch);
  std::vector<int> host(4 * batch, 0);
  for (size_t b = 0; b < batch; ++b) {
    host[b] = int(p.seqlen_q[b]);
    host[batch + b] = int(p.seqlen_kv[b]);
    if (p.format == Format::kTHD) {
      host[2 * batch + b] = int(p.seq_start_q[b]);
      host[3 * batch + b] = int(p.seq_start_kv[b]);
    }
  }
  SequenceTables tables;
  tables.storage = upload(host, stream);
  const int* base = tables.storage.get<int>();
  tables.seqlen_q = base;
  tables.seqlen_kv = base + batch;
  tables.start_q = base + 2 * batch;
  tables.start_kv = base + 3 * batch;
  return tables;
}

}  // namespace dpa::cuda
