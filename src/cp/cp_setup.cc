#include "cp/cp_setup.h"

#include <string>
#include <vector>

#include "core/problem_builder.h"
#include "cp/window_gather.h"

namespace dpa::cp {
namespace {

std::string str(int64_t value) { return std::to_string(value); }

std::vector<int64_t> read_host_int32(const TensorView& t, const char* name) {
  require(t.ndim == 1 && t.dtype == DType::kInt32, name, "must be a 1-D int32 tensor [b + 1]");
  require(t.device == Device::kCPU, name,
          "must be a host tensor here (CP copies device sequence tables to the host first)");
  std::vector<int64_t> values(size_t(t.shape[0]));
  for (int64_t i = 0; i < t.shape[0]; ++i)
    values[size_t(i)] = static_cast<const int32_t*>(t.data)[i * t.strides[0]];
  return values;
}

SideGeometry side_geometry(Format format, int cp, const TensorView& local, const TensorView& cu,
                           const TensorView& cu_padded, int64_t batch, const char* name,
                           const char* cu_name, const char* padded_name) {
  SideGeometry side;
  if (format == Format::kTHD) {
    require(cu.ndim > 0, cu_name, "is required with format thd");
    std::vector<int64_t> cu_values = read_host_int32(cu, cu_name);
    std::vector<int64_t> padded =
        cu_padded.ndim > 0 ? read_host_int32(cu_padded, padded_name) : cu_values;
    require(int64_t(cu_values.size()) == batch + 1 && padded.size() == cu_values.size(),
            padded_name, [&] { return "must have b + 1 entries like " + std::string(cu_name); });
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t slot = padded[size_t(b + 1)] - padded[size_t(b)];
      const int64_t length = cu_values[size_t(b + 1)] - cu_values[size_t(b)];
      require(slot % (2 * cp) == 0 && slot >= length && length >= 0, padded_name, [&] {
        return "slot " + str(b) + " (" + str(slot) + " rows) must hold the sequence (" +
               str(length) + ") and be a multiple of 2 * cp = " + str(2 * cp) +
               " (see thd_cp_partition)";
      });
      side.length.push_back(length);
      side.chunk.push_back(slot / (2 * cp));
      side.local_start.push_back(padded[size_t(b)] / cp);
    }
    require(local.shape[0] == padded.back() / cp, name, [&] {
      return "must hold cu_seqlens_padded[b] / cp = " + str(padded.back() / cp) + " rows, got " +
             str(local.shape[0]);
    });
  } else {
    const int64_t local_seq = local.shape[format == Format::kBSHD ? 1 : 0];
    require(local_seq % 2 == 0, name, [&] {
      return "local sequence length must be even (two chunks per rank), got " + str(local_seq);
    });
    const int64_t full = local_seq * cp;
    std::vector<int64_t> lengths(size_t(batch), full);
    if (cu.ndim > 0) {
      std::vector<int64_t> cu_values = read_host_int32(cu, cu_name);
      require(int64_t(cu_values.size()) == batch + 1, cu_name, "must have b + 1 entries");
      for (int64_t b = 0; b < batch; ++b) {
        lengths[size_t(b)] = cu_values[size_t(b + 1)] - cu_values[size_t(b)];
        require(lengths[size_t(b)] >= 0 && lengths[size_t(b)] <= full, cu_name,
                [&] { return "gives a length outside [0, " + str(full) + "]"; });
      }
    }
    side.length = lengths;
    side.chunk.assign(size_t(batch), local_seq / 2);
    side.local_start.assign(size_t(batch), 0);
  }
  int64_t prefix = 0;
  for (int64_t c : side.chunk) {
    side.prefix.push_back(prefix);
    prefix += c;
  }
  side.rows_per_chunk = prefix;
  return side;
}

Plan make_plan(const CpConfig& config, const Communicator& comm, int64_t heads_q,
               int64_t heads_kv) {
  Plan plan;
  plan.cp = comm.size();
  plan.rank = comm.rank();
  plan.heads_q = heads_q;
  plan.heads_kv = heads_kv;
  switch (config.comm_type) {
    case CpCommType::kP2P:
      plan.a2a = 1;
      break;
    case CpCommType::kAllGather:
      plan.a2a = 1;
      plan.all_gather = true;
      break;
    case CpCommType::kA2A:
      plan.a2a = plan.cp;
      break;
    case CpCommType::kA2AP2P:
      require(config.a2a_group_size >= 1 && plan.cp % config.a2a_group_size == 0, "a2a_group_size",
              [&] {
                return "must divide the CP size " + str(plan.cp) + ", got " +
                       str(config.a2a_group_size);
              });
      plan.a2a = config.a2a_group_size;
      break;
  }
  require(heads_q % plan.a2a == 0, "q", [&] {
    return "head count H = " + str(heads_q) + " must be a multiple of the a2a group size " +
           str(plan.a2a) + " (heads are sharded)";
  });
  // KV heads: when G does not split over the group, replicate them to the fewest G' (a
  // multiple of G dividing H) that does, instead of refusing (DESIGN.md §8).
  int64_t replicated = heads_kv;
  while (replicated % plan.a2a != 0 || heads_q % replicated != 0) replicated += heads_kv;
  plan.kv_replication = replicated / heads_kv;
  plan.group = plan.rank / plan.a2a;
  plan.member = plan.rank % plan.a2a;
  for (int d = 0; d < plan.a2a; ++d) plan.group_ranks.push_back(plan.rank_of(plan.group, d));
  if (plan.all_gather)
    plan.ring_ranks = {plan.rank};
  else
    for (int g = 0; g < plan.cp / plan.a2a; ++g)
      plan.ring_ranks.push_back(plan.rank_of(g, plan.member));
  return plan;
}

// Rows of the unsharded sequences along one side: the padded length (bshd / sbhd) or the
// longest sequence (thd), as the non-CP problem's max_seqlen.
int64_t unsharded_rows(const Geometry& g, const SideGeometry& side) {
  int64_t rows = 0;
  for (size_t b = 0; b < side.length.size(); ++b)
    rows = std::max(rows, g.format == Format::kTHD ? side.length[b] : side.chunk[b] * 2 * g.cp);
  return rows;
}

// A [b|1, H|1, Sq|1, Skv] host tensor of the unsharded sequences (bias, attn_mask, dbias).
void require_unsharded(const TensorView& t, const char* name, const Geometry& g, int64_t heads,
                       bool row_broadcast) {
  const int64_t sq = unsharded_rows(g, g.q), skv = unsharded_rows(g, g.kv);
  std::string expected = "[";  // appended piecewise: GCC 12 misreports a + chain (-Wrestrict)
  expected += str(g.batch);
  expected += "|1, ";
  expected += str(heads);
  expected += "|1, ";
  expected += str(sq);
  expected += row_broadcast ? "|1, " : ", ";
  expected += str(skv);
  expected += "]";
  require(t.ndim == 4, name, [&] {
    return "must be a tensor " + expected +
           " of the unsharded sequences (every rank passes the whole tensor)";
  });
  require((t.shape[0] == g.batch || t.shape[0] == 1) && (t.shape[1] == heads || t.shape[1] == 1) &&
              (t.shape[2] == sq || (row_broadcast && t.shape[2] == 1)) && t.shape[3] == skv,
          name, [&] {
            return "must have the unsharded shape " + expected + ", got " + t.shape_string();
          });
}

}  // namespace

void require_like(const TensorView& t, const TensorView& like, int64_t dim, const char* name) {
  require(t.ndim == like.ndim && t.dtype == like.dtype && t.device == like.device &&
              t.device_index == like.device_index,
          name, "must be a tensor like the local q shard, on its device");
  for (int d = 0; d + 1 < like.ndim; ++d)
    require(t.shape[d] == like.shape[d], name, "must have the local shard's shape");
  require(t.shape[t.ndim - 1] == dim && t.strides[t.ndim - 1] == 1, name,
          [&] { return "must have a contiguous last dim of " + str(dim); });
}

Setup setup(const AttentionConfig& config, const CpConfig& cp, const Communicator& comm,
            const AttentionInputs& in) {
  validate_config(config);
  require(comm.size() >= 1 && comm.rank() >= 0 && comm.rank() < comm.size(), "communicator",
          "has an invalid rank/size");
  const int expected_ndim = config.format == Format::kTHD ? 3 : 4;
  // Every tensor on q's device (the host, or one GPU for the device-resident algorithms); the
  // sequence tables on the host (cp_attention.cc copies device tables first).
  auto on_q_device = [&](const TensorView& t) {
    return t.device == in.q.device && t.device_index == in.q.device_index;
  };
  for (const auto& [t, name] : {std::pair{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}}) {
    require(t->ndim == expected_ndim && on_q_device(*t), name,
            [&] { return "must have " + str(expected_ndim) + " dims, on q's device"; });
    require(t->strides[t->ndim - 1] == 1, name, "must have a contiguous head dim");
    require(t->dtype == in.q.dtype && is_floating(t->dtype), name, "must share q's floating dtype");
  }
  const int hd = expected_ndim - 2;
  const int64_t heads_q = in.q.shape[hd], heads_kv = in.k.shape[hd];
  require(heads_kv > 0 && heads_q % heads_kv == 0 && in.v.shape[hd] == heads_kv, "k",
          "KV heads must divide the query heads (and match v)");
  require(in.k.shape[hd + 1] == in.q.shape[hd + 1], "k", "must have q's head dim");
  if (config.format != Format::kTHD) {
    const int batch_dim = config.format == Format::kBSHD ? 0 : 1;
    require(in.k.shape[batch_dim] == in.q.shape[batch_dim], "k", "batch differs from q's");
  }
  if (config.softmax_type == SoftmaxType::kLearnable) {
    const TensorView& s = in.softmax_offset;
    require(s.ndim == 1 && s.shape[0] == heads_q && s.dtype == DType::kFloat32 &&
                s.is_contiguous() && on_q_device(s),
            "softmax_offset",
            "must be a contiguous fp32 [H] tensor on q's device (the full, unsharded offsets)");
  }
  if (in.alibi_slopes.ndim > 0)
    require(in.alibi_slopes.is_contiguous() && in.alibi_slopes.dtype == DType::kFloat32 &&
                on_q_device(in.alibi_slopes),
            "alibi_slopes", "must be contiguous fp32 on q's device");
  for (const auto& [t, name] : {std::pair{&in.bias, "bias"}, {&in.attn_mask, "attn_mask"}})
    require(t->ndim == 0 || on_q_device(*t), name, "must be on q's device");

  Setup s;
  Geometry& g = s.geometry;
  g.format = config.format;
  g.cp = comm.size();
  g.batch = config.format == Format::kTHD ? in.cu_seqlens_q.shape[0] - 1
                                          : in.q.shape[config.format == Format::kBSHD ? 0 : 1];
  require(config.format != Format::kTHD || in.cu_seqlens_q.ndim == 1, "cu_seqlens_q",
          "is required with format thd");
  g.q = side_geometry(config.format, g.cp, in.q, in.cu_seqlens_q, in.cu_seqlens_q_padded, g.batch,
                      "q", "cu_seqlens_q", "cu_seqlens_q_padded");
  g.kv = side_geometry(config.format, g.cp, in.k, in.cu_seqlens_kv, in.cu_seqlens_kv_padded,
                       g.batch, "k", "cu_seqlens_kv", "cu_seqlens_kv_padded");
  require(in.v.shape[0] == in.k.shape[0] && in.v.shape[1] == in.k.shape[1], "v",
          "must have k's rows");
  const bool bottom_right = mask_bottom_right(config.mask_type, config.bottom_right_diagonal);
  for (int64_t b = 0; b < g.batch; ++b)
    g.diagonal.push_back(bottom_right ? g.kv.length[size_t(b)] - g.q.length[size_t(b)] : 0);
  g.window_left = config.window_left;
  g.window_right = mask_is_causal(config.mask_type) ? 0 : config.window_right;
  s.plan = make_plan(cp, comm, heads_q, heads_kv);

  // Bias and arbitrary mask: every rank passes the unsharded tensor; tiles read it at their
  // global positions.
  if (config.bias_type == BiasType::kNoBias) {
    require(in.bias.ndim == 0, "bias", "is given but bias_type is no_bias");
  } else {
    require(in.bias.ndim > 0, "bias", [&] {
      return "is required with bias_type " + std::string(to_string(config.bias_type));
    });
    require(is_floating(in.bias.dtype), "bias", "must be a floating-point tensor");
    require_unsharded(in.bias, "bias", g, heads_q, true);
  }
  if (config.mask_type == MaskType::kArbitrary) {
    require(in.attn_mask.ndim > 0 && in.attn_mask.dtype == DType::kBool, "attn_mask",
            "must be a bool tensor with mask_type arbitrary");
    require_unsharded(in.attn_mask, "attn_mask", g, heads_q, false);
  } else {
    require(in.attn_mask.ndim == 0, "attn_mask", "is only used with mask_type arbitrary");
  }
  // p2p under a narrow window: the window-aware gather moves only the chunks the window sees
  // (tile_may_see reads the geometry and the config, not the dropout or its seed).
  if (p2p_takes_window_gather(s.plan, tile_context(config, s, in, 0.0, RngState{})))
    take_window_gather(s.plan);
  return s;
}

TileContext tile_context(const AttentionConfig& config, const Setup& s, const AttentionInputs& in,
                         double dropout, const RngState& rng) {
  TileContext ctx;
  ctx.config = config;
  ctx.geometry = &s.geometry;
  ctx.softmax_offset = in.softmax_offset;
  ctx.alibi_slopes = in.alibi_slopes;
  ctx.heads_total = s.plan.heads_q;
  ctx.head_offset = s.plan.member * s.plan.local_heads();
  ctx.bias_type = config.bias_type;
  ctx.bias = in.bias;
  if (config.mask_type == MaskType::kArbitrary) ctx.attn_mask = in.attn_mask;
  ctx.dropout = dropout;
  ctx.rng = rng;
  return ctx;
}

}  // namespace dpa::cp
