// Dual-chunk sharding (DESIGN.md §8) of whole tensors, and the comm type names.
#include <string>

#include "core/element_access.h"
#include "dpa/cp.h"
#include "dpa/error.h"

namespace dpa {

std::string_view to_string(CpCommType type) {
  switch (type) {
    case CpCommType::kP2P:
      return "p2p";
    case CpCommType::kAllGather:
      return "all_gather";
    case CpCommType::kA2A:
      return "a2a";
    case CpCommType::kA2AP2P:
      return "a2a_p2p";
  }
  return "?";
}

std::optional<CpCommType> parse_cp_comm_type(std::string_view name) {
  if (name == "p2p") return CpCommType::kP2P;
  if (name == "all_gather" || name == "allgather") return CpCommType::kAllGather;
  if (name == "a2a") return CpCommType::kA2A;
  if (name == "a2a_p2p" || name == "a2a+p2p") return CpCommType::kA2AP2P;
  return std::nullopt;
}

std::vector<int64_t> dual_chunk_positions(int64_t seqlen, int cp, int rank) {
  require(cp >= 1, "cp", "must be >= 1");
  require(rank >= 0 && rank < cp, "rank", "must be in [0, cp)");
  require(seqlen % (2 * cp) == 0, "seqlen", [&] {
    return "must be a multiple of 2 * cp = " + std::to_string(2 * cp) + ", got " +
           std::to_string(seqlen);
  });
  const int64_t chunk = seqlen / (2 * cp);
  std::vector<int64_t> positions;
  positions.reserve(size_t(2 * chunk));
  for (int64_t i = 0; i < chunk; ++i) positions.push_back(rank * chunk + i);
  for (int64_t i = 0; i < chunk; ++i) positions.push_back((2 * cp - 1 - rank) * chunk + i);
  return positions;
}

ThdCpPartition thd_cp_partition(const std::vector<int32_t>& lengths, int cp) {
  require(cp >= 1, "cp", "must be >= 1");
  ThdCpPartition partition;
  partition.cu_seqlens.push_back(0);
  partition.cu_seqlens_padded.push_back(0);
  partition.local_cu_padded.push_back(0);
  for (int32_t length : lengths) {
    require(length >= 0, "lengths", "must be non-negative");
    const int32_t multiple = 2 * cp;
    const int32_t padded = (length + multiple - 1) / multiple * multiple;
    partition.cu_seqlens.push_back(partition.cu_seqlens.back() + length);
    partition.cu_seqlens_padded.push_back(partition.cu_seqlens_padded.back() + padded);
    partition.local_cu_padded.push_back(partition.local_cu_padded.back() + padded / cp);
  }
  return partition;
}

namespace {

// Calls fn(full_offset, local_offset) for the first element of every (b, local row, head)
// row of a [.., s, H, d]-like tensor; the caller copies `d` elements.
template <typename Fn>
void for_each_shard_row(const TensorView& full, const TensorView& local, Format format, int cp,
                        int rank, const std::vector<int32_t>& cu_padded, Fn&& fn) {
  const int hd = full.ndim - 2;  // the head dim's index
  require(full.ndim == local.ndim && full.ndim >= 3, "local", "must match the full tensor's rank");
  const int64_t heads = full.shape[hd];
  if (format == Format::kTHD) {
    require(!cu_padded.empty(), "cu_seqlens_padded", "is required to shard thd tensors");
    for (size_t b = 0; b + 1 < cu_padded.size(); ++b) {
      const int64_t slot = cu_padded[b + 1] - cu_padded[b];
      const std::vector<int64_t> positions = dual_chunk_positions(slot, cp, rank);
      const int64_t local_start = cu_padded[b] / cp;
      for (size_t i = 0; i < positions.size(); ++i)
        for (int64_t h = 0; h < heads; ++h)
          fn((cu_padded[b] + positions[i]) * full.strides[0] + h * full.strides[1],
             (local_start + int64_t(i)) * local.strides[0] + h * local.strides[1]);
    }
    return;
  }
  const int seq_dim = format == Format::kBSHD ? 1 : 0, batch_dim = 1 - seq_dim;
  const std::vector<int64_t> positions = dual_chunk_positions(full.shape[seq_dim], cp, rank);
  require(local.shape[seq_dim] == int64_t(positions.size()), "local",
          [&] { return "must hold s / cp = " + std::to_string(positions.size()) + " rows"; });
  for (int64_t b = 0; b < full.shape[batch_dim]; ++b)
    for (size_t i = 0; i < positions.size(); ++i)
      for (int64_t h = 0; h < heads; ++h)
        fn(b * full.strides[batch_dim] + positions[i] * full.strides[seq_dim] +
               h * full.strides[hd],
           b * local.strides[batch_dim] + int64_t(i) * local.strides[seq_dim] +
               h * local.strides[hd]);
}

template <typename Fn>
void for_each_lse_shard(const TensorView& full, const TensorView& local, Format format, int cp,
                        int rank, const std::vector<int32_t>& cu_padded, Fn&& fn) {
  if (format == Format::kTHD) {
    require(!cu_padded.empty(), "cu_seqlens_padded", "is required to shard thd tensors");
    for (int64_t h = 0; h < full.shape[0]; ++h)
      for (size_t b = 0; b + 1 < cu_padded.size(); ++b) {
        const std::vector<int64_t> positions =
            dual_chunk_positions(cu_padded[b + 1] - cu_padded[b], cp, rank);
        for (size_t i = 0; i < positions.size(); ++i)
          fn(h * full.strides[0] + (cu_padded[b] + positions[i]) * full.strides[1],
             h * local.strides[0] + (cu_padded[b] / cp + int64_t(i)) * local.strides[1]);
      }
    return;
  }
  const std::vector<int64_t> positions = dual_chunk_positions(full.shape[2], cp, rank);
  for (int64_t b = 0; b < full.shape[0]; ++b)
    for (int64_t h = 0; h < full.shape[1]; ++h)
      for (size_t i = 0; i < positions.size(); ++i)
        fn(b * full.strides[0] + h * full.strides[1] + positions[i] * full.strides[2],
           b * local.strides[0] + h * local.strides[1] + int64_t(i) * local.strides[2]);
}

}  // namespace

void shard_sequence(const TensorView& full, const TensorView& local, Format format, int cp,
                    int rank, const std::vector<int32_t>& cu_seqlens_padded) {
  const int64_t width = full.shape[full.ndim - 1];
  for_each_shard_row(full, local, format, cp, rank, cu_seqlens_padded, [&](int64_t f, int64_t l) {
    for (int64_t c = 0; c < width; ++c) store(local, l + c, load(full, f + c));
  });
}

void unshard_sequence(const TensorView& local, const TensorView& full, Format format, int cp,
                      int rank, const std::vector<int32_t>& cu_seqlens_padded) {
  const int64_t width = full.shape[full.ndim - 1];
  for_each_shard_row(full, local, format, cp, rank, cu_seqlens_padded, [&](int64_t f, int64_t l) {
    for (int64_t c = 0; c < width; ++c) store(full, f + c, load(local, l + c));
  });
}

void shard_lse(const TensorView& full, const TensorView& local, Format format, int cp, int rank,
               const std::vector<int32_t>& cu_seqlens_padded) {
  for_each_lse_shard(full, local, format, cp, rank, cu_seqlens_padded,
                     [&](int64_t f, int64_t l) { store(local, l, load(full, f)); });
}

void unshard_lse(const TensorView& local, const TensorView& full, Format format, int cp, int rank,
                 const std::vector<int32_t>& cu_seqlens_padded) {
  for_each_lse_shard(full, local, format, cp, rank, cu_seqlens_padded,
                     [&](int64_t f, int64_t l) { store(full, f, load(local, l)); });
}

}  // namespace dpa
