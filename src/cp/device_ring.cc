#include "cp/device_ring.h"

#include <cmath>
#include <utility>
#include <vector>

#include "core/problem_builder.h"
#include "core/selector.h"
#include "cp/calls_in_flight.h"
#include "cp/comm_requests.h"

#if defined(DPA_WITH_CUDA)
#include "cuda/cp_ring_ops.h"
#include "cuda/runtime.h"
#endif

namespace dpa::cp {

StepTile step_tile(bool causal, int rank, int source, int64_t rows) {
  const int64_t half = rows / 2;
  if (!causal) return {0, rows, 0, rows, false};
  if (source == rank) return {0, rows, 0, rows, true};
  if (source < rank) return {0, rows, 0, half, false};
  return {half, half, 0, rows, false};
}

#if !defined(DPA_WITH_CUDA)

class RingWorkspace {};
std::shared_ptr<RingWorkspace> make_ring_workspace() { return std::make_shared<RingWorkspace>(); }

std::string device_ring_refusal(const AttentionConfig&, const CpConfig&, const AttentionInputs&,
                                double) {
  return "a build without CUDA";
}

ForwardResult device_ring_forward(const AttentionConfig&, DeviceCommunicator&, const ForwardArgs&,
                                  const RngState&, RingWorkspace*, CallsInFlight*) {
  throw Error(ErrorCode::kNotSupported, "communicator", "the device ring needs a build with CUDA");
}
BackendKind device_ring_backward(const AttentionConfig&, const CpConfig&, DeviceCommunicator&,
                                 const BackwardArgs&, RingWorkspace*, CallsInFlight*) {
  throw Error(ErrorCode::kNotSupported, "communicator", "the device ring needs a build with CUDA");
}

#else

class RingWorkspace {
 public:
  // `bytes` of device memory on `device` for buffer `slot`, valid until the next call. A buffer
  // that must grow (the first calls, a larger shape) is freed first, which waits for the whole
  // device (cudaFree): the calls in flight (`in_flight`, may be null) are waited for before, so
  // that a failed peer throws at its deadline there and the wait is the documented one.
  void* get(int slot, size_t bytes, int device, CallsInFlight* in_flight) {
    if (size_t(slot) >= buffers_.size()) buffers_.resize(size_t(slot) + 1);
    Buffer& b = buffers_[size_t(slot)];
    if (b.bytes < bytes || b.device != device) {
      if (in_flight != nullptr && b.memory.get() != nullptr) in_flight->wait();
      b.memory = cuda::DeviceMemory();  // free first: the old and new may not fit together
      b.bytes = 0;                      // stays empty if the allocation throws
      b.memory = cuda::DeviceMemory(bytes, device);
      b.bytes = bytes;
      b.device = device;
    }
    return b.memory.get();
  }

 private:
  struct Buffer {
    cuda::DeviceMemory memory;
    size_t bytes = 0;
    int device = -1;
  };
  std::vector<Buffer> buffers_;
};

std::shared_ptr<RingWorkspace> make_ring_workspace() { return std::make_shared<RingWorkspace>(); }

namespace {

using cuda::RowBlock;

// The buffers of one call, by slot; forward and backward share slots where they can.
enum Slot : int {
  kKvA,
  kKvB,
  kAccumulator,  // o (forward) or dq (backward), fp32
  kQueryTile,    // o or dq of one tile
  kLseA,         // the LSE accumulator (forward) or a tile's rows of the final LSE (backward)
  kLseB,         // a tile's LSE (forward)
  kDkvA,
  kDkvB,
  kDkTile,
  kDvTile,
};

std::string str(int64_t value) { return std::to_string(value); }

// The local shard: [batch, rows, heads, dim] in bshd, [rows, batch, heads, dim] in sbhd.
struct Shard {
  Format format = Format::kBSHD;
  int64_t batch = 0, rows = 0, heads_q = 0, heads_kv = 0, dqk = 0, dv = 0;
  DType dtype = DType::kBFloat16;
  int device = 0;

  int seq_dim() const { return format == Format::kBSHD ? 1 : 0; }
  int batch_dim() const { return format == Format::kBSHD ? 0 : 1; }
  size_t bytes(int64_t heads, int64_t dim, size_t element = 0) const {
    return size_t(batch * rows * heads * dim) * (element ? element : dtype_size(dtype));
  }
  // A contiguous CUDA view of `rows_` rows shaped like the shard.
  TensorView view(void* data, DType type, int64_t rows_, int64_t heads, int64_t dim) const {
    const int64_t shape[4] = {format == Format::kBSHD ? batch : rows_,
                              format == Format::kBSHD ? rows_ : batch, heads, dim};
    TensorView t = TensorView::contiguous(data, type, shape, 4, Device::kCUDA);
    t.device_index = device;
    return t;
  }
  TensorView lse_view(float* data, int64_t rows_) const {
    TensorView t =
        TensorView::contiguous(data, DType::kFloat32, {batch, heads_q, rows_}, Device::kCUDA);
    t.device_index = device;
    return t;
  }
};

Shard shard_of(const AttentionConfig& config, const AttentionInputs& in) {
  Shard s;
  s.format = config.format;
  s.batch = in.q.shape[s.batch_dim()];
  s.rows = in.q.shape[s.seq_dim()];
  s.heads_q = in.q.shape[2];
  s.heads_kv = in.k.shape[2];
  s.dqk = in.q.shape[3];
  s.dv = in.v.shape[3];
  s.dtype = in.q.dtype;
  s.device = in.q.device_index;
  require(in.k.shape[s.batch_dim()] == s.batch && in.v.shape[s.batch_dim()] == s.batch &&
              in.v.shape[s.seq_dim()] == s.rows && in.k.shape[3] == s.dqk &&
              in.v.shape[2] == s.heads_kv,
          "k", "k and v must match q's batch and local length and each other's heads");
  return s;
}

// Where the call's work runs: the shard's device, the caller's stream.
Placement placement_of(const Shard& s, void* stream) { return {Device::kCUDA, s.device, stream}; }

// Rows [first, first + count) of a shard-shaped view.
TensorView rows_of(const TensorView& t, const Shard& s, int64_t first, int64_t count) {
  TensorView slice = t;
  slice.data =
      static_cast<char*>(t.data) + first * t.strides[s.seq_dim()] * int64_t(dtype_size(t.dtype));
  slice.shape[s.seq_dim()] = count;
  return slice;
}

RowBlock block_of(const TensorView& t, const Shard& s) {
  RowBlock b;
  b.data = t.data;
  b.batch = t.shape[s.batch_dim()];
  b.rows = t.shape[s.seq_dim()];
  b.width = t.shape[2] * t.shape[3];
  b.batch_stride = t.strides[s.batch_dim()];
  b.row_stride = t.strides[s.seq_dim()];
  return b;
}

// `name` must be a contiguous CUDA tensor on the shard's device with this shape and dtype.
void require_shard_tensor(const TensorView& t, const char* name, const Shard& s, DType dtype,
                          const std::vector<int64_t>& shape) {
  bool same = t.ndim == int(shape.size());
  for (size_t d = 0; same && d < shape.size(); ++d) same = t.shape[d] == shape[d];
  std::string expected = "[";
  for (size_t d = 0; d < shape.size(); ++d) expected += (d ? ", " : "") + str(shape[d]);
  expected += "]";
  require(same && t.dtype == dtype && t.is_contiguous() && t.device == Device::kCUDA &&
              t.device_index == s.device,
          name, [&] {
            return "must be a contiguous " + std::string(to_string(dtype)) + " tensor " + expected +
                   " on CUDA device " + str(s.device) + " (the device ring), got " +
                   t.shape_string();
          });
}

std::vector<int64_t> shard_shape(const Shard& s, int64_t heads, int64_t dim) {
  if (s.format == Format::kBSHD) return {s.batch, s.rows, heads, dim};
  return {s.rows, s.batch, heads, dim};
}

// Everything a call is checked for before its first transfer (the tiles' own checks come
// later, when peers are already waiting: a rank that fails there aborts the communicator).
Shard validated_shard(const AttentionConfig& config, const DeviceCommunicator& comm,
                      const AttentionInputs& in) {
  const Shard s = shard_of(config, in);
  require(comm.device() == s.device, "q", [&] {
    return "must be on the communicator's CUDA device " + str(comm.device()) + ", got device " +
           str(s.device);
  });
  require(s.heads_kv > 0 && s.heads_q % s.heads_kv == 0, "k",
          "KV heads must divide the query heads");
  if (config.softmax_type == SoftmaxType::kLearnable)
    require_shard_tensor(in.softmax_offset, "softmax_offset", s, DType::kFloat32, {s.heads_q});
  return s;
}

// The tile's rows of q and of the held k and v.
AttentionInputs tile_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                            const Shard& s, const StepTile& tile) {
  AttentionInputs in;
  in.q = rows_of(q, s, tile.q_first, tile.q_rows);
  in.k = rows_of(k, s, tile.kv_first, tile.kv_rows);
  in.v = rows_of(v, s, tile.kv_first, tile.kv_rows);
  return in;
}

// Posts send(a, b) to the next rank and recv(into_a, into_b) from the previous one, ordered
// after the compute stream's work so far, and launches them.
std::vector<CommHandle> exchange(DeviceCommunicator& comm, const Ring& ring, void* stream,
                                 const void* a, const void* b, void* into_a, void* into_b,
                                 size_t bytes_a, size_t bytes_b) {
  cuda::order_after(comm.stream(), stream);
  std::vector<CommHandle> handles;
  handles.push_back(comm.send(a, bytes_a, ring.next(), 0));
  handles.push_back(comm.send(b, bytes_b, ring.next(), 0));
  handles.push_back(comm.recv(into_a, bytes_a, ring.previous(), 0));
  handles.push_back(comm.recv(into_b, bytes_b, ring.previous(), 0));
  comm.start_pending();
  return handles;
}

// Where the next step's KV lands (the other of two buffers) and its transfer from the previous
// rank, posted together with the transfer of the held KV to the next one; after the last step,
// the held KV itself and nothing pending.
struct KvTransfer {
  TensorView k, v;
  std::vector<CommHandle> pending;
};

KvTransfer post_kv(DeviceCommunicator& comm, const Ring& ring, void* stream, int step,
                   const TensorView& k, const TensorView& v, void* const buffers[2], size_t k_bytes,
                   size_t v_bytes) {
  KvTransfer next{k, v, {}};
  if (step + 1 < ring.size) {
    char* buffer = static_cast<char*>(buffers[step % 2]);
    next.k.data = buffer;
    next.v.data = buffer + k_bytes;
    next.pending =
        exchange(comm, ring, stream, k.data, v.data, next.k.data, next.v.data, k_bytes, v_bytes);
  }
  return next;
}

AttentionConfig tile_config(const AttentionConfig& config, bool causal) {
  AttentionConfig tile = config;
  tile.mask_type = causal ? MaskType::kCausal : MaskType::kNoMask;
  tile.window_left = tile.window_right = -1;
  tile.softmax_type = SoftmaxType::kVanilla;  // the sink joins once, after the merge
  // The ring runs only where the call's dropout is 0 (device_ring_refusal), which a per-call
  // override can make so while config.dropout is not: the tiles must not draw it either.
  tile.dropout = 0.0;
  return tile;
}

// One step's backward tile over the call's final LSE (merged, sink included): P = exp(S - LSE)
// is then the true P. Through the public call a backend may recompute the tile's own LSE
// instead, which is right for an ordinary call and wrong here (cuda_unfused did, session 32),
// so the tile's problem says so (CpTile::use_given_lse), as the general algorithms' tiles do.
BackendKind backward_tile(const AttentionConfig& tile, const BackwardArgs& args) {
  AttentionProblem p = build_backward_problem(tile, args, tile.dropout);
  p.cp.use_given_lse = true;
  const Backend& backend = choose_backend(tile, p, registered_backends());
  backend.backward(p);
  return backend.capabilities().kind;
}

}  // namespace

std::string device_ring_refusal(const AttentionConfig& config, const CpConfig& cp,
                                const AttentionInputs& in, double dropout) {
  if (in.q.device != Device::kCUDA) return "host tensors";
  if (cp.comm_type != CpCommType::kP2P)
    return "comm type " + std::string(to_string(cp.comm_type)) + " (the device ring is p2p)";
  if (config.format == Format::kTHD) return "format thd";
  if (in.cu_seqlens_q.defined() || in.cu_seqlens_kv.defined()) return "sequence tables (padding)";
  if (mask_is_padding(config.mask_type) || config.mask_type == MaskType::kArbitrary)
    return "a padding or arbitrary mask";
  const bool causal = mask_is_causal(config.mask_type);
  if (config.window_left >= 0 || config.window_right > 0 || (!causal && config.window_right == 0))
    return "a sliding window";
  if (config.bias_type != BiasType::kNoBias || in.bias.defined()) return "a bias";
  if (in.alibi_slopes.defined()) return "ALiBi";
  if (in.attn_mask.defined()) return "an attention mask";
  if (dropout > 0.0) return "dropout";
  if (in.q.dtype != DType::kFloat16 && in.q.dtype != DType::kBFloat16)
    return "a dtype other "
           "than fp16 or bf16";
  for (const TensorView* t : {&in.q, &in.k, &in.v})
    if (t->ndim != 4 || !t->is_contiguous() || t->device != Device::kCUDA ||
        t->dtype != in.q.dtype || t->device_index != in.q.device_index)
      return "q, k and v not contiguous 4-D tensors of one dtype on one GPU";
  if (in.softmax_offset.defined() && in.softmax_offset.device != Device::kCUDA)
    return "softmax_offset in host memory";
  const int seq_dim = config.format == Format::kBSHD ? 1 : 0;
  if (in.q.shape[seq_dim] % 2 != 0 || in.q.shape[seq_dim] != in.k.shape[seq_dim])
    return "local q and kv lengths that differ or are odd";
  return "";
}

ForwardResult device_ring_forward(const AttentionConfig& config, DeviceCommunicator& comm,
                                  const ForwardArgs& args, const RngState& rng,
                                  RingWorkspace* workspace, CallsInFlight* in_flight) {
  const Shard s = validated_shard(config, comm, args.in);
  require_shard_tensor(args.o, "o", s, s.dtype, shard_shape(s, s.heads_q, s.dv));
  require_shard_tensor(args.lse, "lse", s, DType::kFloat32, {s.batch, s.heads_q, s.rows});
  const cuda::DeviceGuard guard(s.device);
  void* const stream = args.stream;
  CallScope scope(in_flight, placement_of(s, stream));  // the workspace is this call's
  const Ring ring{comm.rank(), comm.size()};
  const bool causal = mask_is_causal(config.mask_type);  // not padding: refused

  const size_t k_bytes = s.bytes(s.heads_kv, s.dqk), v_bytes = s.bytes(s.heads_kv, s.dv);
  RingWorkspace own;
  RingWorkspace& w = workspace != nullptr ? *workspace : own;
  const size_t lse_bytes = size_t(s.batch * s.heads_q * s.rows) * 4;
  void* const kv_memory[2] = {w.get(kKvA, k_bytes + v_bytes, s.device, in_flight),
                              w.get(kKvB, k_bytes + v_bytes, s.device, in_flight)};
  void* const o_acc = w.get(kAccumulator, s.bytes(s.heads_q, s.dv, 4), s.device, in_flight);
  void* const o_tile = w.get(kQueryTile, s.bytes(s.heads_q, s.dv), s.device, in_flight);
  float* const lse_acc_data = static_cast<float*>(w.get(kLseA, lse_bytes, s.device, in_flight));
  float* const lse_tile = static_cast<float*>(w.get(kLseB, lse_bytes, s.device, in_flight));
  cuda::fill_f32(lse_acc_data, -INFINITY, s.batch * s.heads_q * s.rows, stream);
  const TensorView o_acc_view = s.view(o_acc, DType::kFloat32, s.rows, s.heads_q, s.dv);

  DotProductAttention causal_tiles(tile_config(config, true)),
      full_tiles(tile_config(config, false));
  BackendKind used = BackendKind::kAuto;
  TensorView k = args.in.k, v = args.in.v;
  // Each step's transfers: `stream` is ordered after them; the host waits for them later
  // (CallsInFlight) or at the end (end_call).
  Transfers transfers(comm, true, stream);
  for (int step = 0; step < ring.size; ++step) {
    KvTransfer next = post_kv(comm, ring, stream, step, k, v, kv_memory, k_bytes, v_bytes);
    const StepTile tile = step_tile(causal, ring.rank, ring.source(step), s.rows);
    ForwardArgs a;
    a.in = tile_inputs(args.in.q, k, v, s, tile);
    a.o = s.view(o_tile, s.dtype, tile.q_rows, s.heads_q, s.dv);
    a.lse = s.lse_view(lse_tile, tile.q_rows);
    a.stream = stream;
    used = (tile.causal ? causal_tiles : full_tiles).forward(a).backend;
    cuda::merge_partial_rows(block_of(rows_of(o_acc_view, s, tile.q_first, tile.q_rows), s),
                             lse_acc_data, s.rows, tile.q_first, block_of(a.o, s), s.dtype,
                             lse_tile, s.heads_q, stream);
    transfers.settle(next.pending);  // the next tile reads the KV
    k = next.k;
    v = next.v;
  }
  cuda::finalize_forward_rows(block_of(args.o, s), s.dtype, static_cast<float*>(args.lse.data),
                              block_of(o_acc_view, s), lse_acc_data, s.heads_q,
                              int(config.softmax_type),
                              static_cast<const float*>(args.in.softmax_offset.data), stream);
  scope.finish(transfers);
  return {used, rng};
}

BackendKind device_ring_backward(const AttentionConfig& config, const CpConfig& cp,
                                 DeviceCommunicator& comm, const BackwardArgs& args,
                                 RingWorkspace* workspace, CallsInFlight* in_flight) {
  const Shard s = validated_shard(config, comm, args.in);
  require_shard_tensor(args.o, "o", s, s.dtype, shard_shape(s, s.heads_q, s.dv));
  require_shard_tensor(args.d_o, "d_o", s, s.dtype, shard_shape(s, s.heads_q, s.dv));
  require_shard_tensor(args.lse, "lse", s, DType::kFloat32, {s.batch, s.heads_q, s.rows});
  require_shard_tensor(args.dq, "dq", s, s.dtype, shard_shape(s, s.heads_q, s.dqk));
  require_shard_tensor(args.dk, "dk", s, s.dtype, shard_shape(s, s.heads_kv, s.dqk));
  require_shard_tensor(args.dv, "dv", s, s.dtype, shard_shape(s, s.heads_kv, s.dv));
  const bool wants_dalpha = args.dsoftmax_offset.defined();
  if (wants_dalpha) {
    require(config.softmax_type == SoftmaxType::kLearnable, "dsoftmax_offset",
            "is requested but softmax_type is not learnable");
    require_shard_tensor(args.dsoftmax_offset, "dsoftmax_offset", s, DType::kFloat32, {s.heads_q});
  }
  require(args.dbias.ndim == 0, "dbias", "is requested but there is no bias");
  const cuda::DeviceGuard guard(s.device);
  void* const stream = args.stream;
  CallScope scope(in_flight, placement_of(s, stream));  // the workspace is this call's
  const Ring ring{comm.rank(), comm.size()};
  const bool causal = mask_is_causal(config.mask_type);  // not padding: refused

  const size_t k_bytes = s.bytes(s.heads_kv, s.dqk), v_bytes = s.bytes(s.heads_kv, s.dv);
  const size_t dk_bytes = s.bytes(s.heads_kv, s.dqk, 4), dv_bytes = s.bytes(s.heads_kv, s.dv, 4);
  RingWorkspace own;
  RingWorkspace& w = workspace != nullptr ? *workspace : own;
  void* const kv_memory[2] = {w.get(kKvA, k_bytes + v_bytes, s.device, in_flight),
                              w.get(kKvB, k_bytes + v_bytes, s.device, in_flight)};
  // dKV travels with fp32 accumulators: the gradient of the KV a rank holds now.
  void* const dkv_memory[2] = {w.get(kDkvA, dk_bytes + dv_bytes, s.device, in_flight),
                               w.get(kDkvB, dk_bytes + dv_bytes, s.device, in_flight)};
  void* const dq_acc = w.get(kAccumulator, s.bytes(s.heads_q, s.dqk, 4), s.device, in_flight);
  void* const dq_tile = w.get(kQueryTile, s.bytes(s.heads_q, s.dqk), s.device, in_flight);
  void* const dk_tile = w.get(kDkTile, k_bytes, s.device, in_flight);
  void* const dv_tile = w.get(kDvTile, v_bytes, s.device, in_flight);
  float* const lse_tile = static_cast<float*>(
      w.get(kLseA, size_t(s.batch * s.heads_q * s.rows) * 4, s.device, in_flight));
  const TensorView dq_acc_view = s.view(dq_acc, DType::kFloat32, s.rows, s.heads_q, s.dqk);
  auto dk_acc = [&](int i) {
    return s.view(dkv_memory[i], DType::kFloat32, s.rows, s.heads_kv, s.dqk);
  };
  auto dv_acc = [&](int i) {
    return s.view(static_cast<char*>(dkv_memory[i]) + dk_bytes, DType::kFloat32, s.rows, s.heads_kv,
                  s.dv);
  };
  cuda::fill_f32(static_cast<float*>(dq_acc), 0.f, s.batch * s.rows * s.heads_q * s.dqk, stream);
  cuda::fill_f32(static_cast<float*>(dkv_memory[0]), 0.f, int64_t((dk_bytes + dv_bytes) / 4),
                 stream);

  const AttentionConfig causal_tiles = tile_config(config, true),
                        full_tiles = tile_config(config, false);
  BackendKind used = BackendKind::kAuto;
  TensorView k = args.in.k, v = args.in.v;
  int held = 0;  // dkv_memory[held]: the gradient of the KV this rank holds
  std::vector<CommHandle> pending_dkv;
  // Each step's transfers: `stream` is ordered after them; the host waits for them later
  // (CallsInFlight) or at the end (end_call).
  Transfers transfers(comm, true, stream);
  for (int step = 0; step < ring.size; ++step) {
    KvTransfer next = post_kv(comm, ring, stream, step, k, v, kv_memory, k_bytes, v_bytes);
    const StepTile tile = step_tile(causal, ring.rank, ring.source(step), s.rows);
    BackwardArgs a;
    a.in = tile_inputs(args.in.q, k, v, s, tile);
    a.o = rows_of(args.o, s, tile.q_first, tile.q_rows);
    a.d_o = rows_of(args.d_o, s, tile.q_first, tile.q_rows);
    a.lse = args.lse;  // the final LSE, sink included: P = exp(S - LSE') is the true P
    if (tile.q_rows != s.rows) {
      cuda::copy_lse_rows(lse_tile, static_cast<const float*>(args.lse.data), s.batch * s.heads_q,
                          s.rows, tile.q_first, tile.q_rows, stream);
      a.lse = s.lse_view(lse_tile, tile.q_rows);
    }
    a.dq = s.view(dq_tile, s.dtype, tile.q_rows, s.heads_q, s.dqk);
    a.dk = s.view(dk_tile, s.dtype, tile.kv_rows, s.heads_kv, s.dqk);
    a.dv = s.view(dv_tile, s.dtype, tile.kv_rows, s.heads_kv, s.dv);
    a.stream = stream;
    used = backward_tile(tile.causal ? causal_tiles : full_tiles, a);
    cuda::accumulate_rows(block_of(rows_of(dq_acc_view, s, tile.q_first, tile.q_rows), s),
                          block_of(a.dq, s), s.dtype, stream);
    // The held dKV arrives with the previous step's exchange; the tile above already runs.
    transfers.settle(pending_dkv);
    cuda::accumulate_rows(block_of(rows_of(dk_acc(held), s, tile.kv_first, tile.kv_rows), s),
                          block_of(a.dk, s), s.dtype, stream);
    cuda::accumulate_rows(block_of(rows_of(dv_acc(held), s, tile.kv_first, tile.kv_rows), s),
                          block_of(a.dv, s), s.dtype, stream);
    if (ring.size > 1) {  // after n transfers each dKV is back with its owner
      pending_dkv = exchange(comm, ring, stream, dk_acc(held).data, dv_acc(held).data,
                             dk_acc(1 - held).data, dv_acc(1 - held).data, dk_bytes, dv_bytes);
      held = 1 - held;
    }
    transfers.settle(next.pending);
    k = next.k;
    v = next.v;
  }
  transfers.settle(pending_dkv);
  cuda::convert_rows(block_of(args.dq, s), s.dtype, block_of(dq_acc_view, s), stream);
  cuda::convert_rows(block_of(args.dk, s), s.dtype, block_of(dk_acc(held), s), stream);
  cuda::convert_rows(block_of(args.dv, s), s.dtype, block_of(dv_acc(held), s), stream);
  if (wants_dalpha) {
    float* dalpha = static_cast<float*>(args.dsoftmax_offset.data);
    cuda::sink_gradient(dalpha, block_of(args.o, s), block_of(args.d_o, s), s.dtype,
                        static_cast<const float*>(args.lse.data), s.heads_q,
                        static_cast<const float*>(args.in.softmax_offset.data), stream);
    if (cp.reduce_dalpha) {
      cuda::order_after(comm.stream(), stream);
      std::vector<CommHandle> reduction;
      reduction.push_back(comm.all_reduce(dalpha, s.heads_q, DType::kFloat32));
      transfers.settle(reduction);
    }
  }
  scope.finish(transfers);
  return used;
}

#endif

}  // namespace dpa::cp
