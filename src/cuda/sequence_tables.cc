#include "cuda/sequence_tables.h"

#include <vector>

namespace dpa::cuda {

namespace {

constexpr size_t kTables = 7;  // seqlen_q, seqlen_kv, start_q, start_kv, diagonal, positions

}  // namespace

size_t sequence_tables_bytes(const AttentionProblem& p) {
  return kTables * size_t(p.batch) * sizeof(int);
}

SequenceTables upload_sequence_tables(const AttentionProblem& p, cudaStream_t stream) {
  const size_t batch = size_t(p.batch);
  std::vector<int> host(kTables * batch, 0);
  for (size_t b = 0; b < batch; ++b) {
    host[b] = int(p.seqlen_q[b]);
    host[batch + b] = int(p.seqlen_kv[b]);
    if (p.format == Format::kTHD) {
      host[2 * batch + b] = int(p.seq_start_q[b]);
      host[3 * batch + b] = int(p.seq_start_kv[b]);
    }
    host[4 * batch + b] = int(p.diagonal_offset(int64_t(b)));
    host[5 * batch + b] = int(p.global_row(int64_t(b), 0));
    host[6 * batch + b] = int(p.global_col(int64_t(b), 0));
  }
  SequenceTables tables;
  tables.storage = upload(host, stream);
  const int* base = tables.storage.get<int>();
  tables.seqlen_q = base;
  tables.seqlen_kv = base + batch;
  tables.start_q = base + 2 * batch;
  tables.start_kv = base + 3 * batch;
  tables.diagonal = base + 4 * batch;
  tables.q_position = base + 5 * batch;
  tables.kv_position = base + 6 * batch;
  return tables;
}

}  // namespace dpa::cuda
