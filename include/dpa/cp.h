// Context parallelism (DESIGN.md §8): every rank holds a shard of the sequence; attention runs
// over a Communicator with one of four comm types and equals the unsharded computation.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dpa/attention.h"

namespace dpa {

namespace cp {
class RingWorkspace;
class CallsInFlight;
}  // namespace cp

// How KV (and dKV) reach the queries that need them.
//   p2p:        KV travels a ring of the cp ranks; dKV travels it in the backward.
//   all_gather: every rank fetches the KV chunks its queries can see (window-aware; all of
//               them without a window or causal mask); the backward returns dKV to the owners.
//   a2a:        Ulysses: all-to-all trades sequence shards for head shards.
//   a2a_p2p:    a2a inside groups of `a2a_group_size` ranks, a p2p ring across the groups.
enum class CpCommType : int { kP2P = 0, kAllGather = 1, kA2A = 2, kA2AP2P = 3 };

std::string_view to_string(CpCommType type);
std::optional<CpCommType> parse_cp_comm_type(
    std::string_view name);  // p2p, all_gather, a2a, a2a_p2p

struct CpConfig {
  CpCommType comm_type = CpCommType::kP2P;
  // a2a_p2p: ranks per all-to-all group (divides the communicator's size).
  int a2a_group_size = 0;
  // dalpha contract (DESIGN.md §8): by default each rank returns its partial dsoftmax_offset
  // (its query rows, or its heads under a2a), and the sum over the CP ranks is the unsharded
  // gradient. true returns the CP-reduced (summed) gradient on every rank instead.
  bool reduce_dalpha = false;
  // dbias contract, the same: by default each rank's dbias holds the gradient of the (query
  // row, key) pairs its tiles computed, zero elsewhere, and the sum over the CP ranks is the
  // unsharded dbias; true returns that sum on every rank.
  bool reduce_dbias = false;
};

// Completion of one asynchronous communication. wait() blocks until it is done and throws
// dpa::Error (kBackendFailure) on failure, timeout or an aborted group. Waiting twice is a no-op.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
  // A device communicator's operation: orders CUDA stream `stream` (of the communicator's
  // device; null is the current device's legacy default stream) after it, so that work
  // enqueued there next may read a received buffer and overwrite a sent one, without the host
  // waiting for the data where the transport allows it (NCCL; the in-process device
  // communicators, whose hosts still wait for the peer to post its side). By default it waits
  // on the host. Work ordered on `stream` after it may then also release or overwrite the
  // buffers (a stream-ordered free or write; anything else waits for wait()). It does not
  // replace wait(): call that too, before the buffers go by other means and before the caller
  // returns; failures and timeouts surface there (a peer that never completes leaves `stream`
  // waiting until then).
  virtual void wait_on_stream(void* /*stream*/) { wait(); }
};
using CommHandle = std::unique_ptr<CommRequest>;

// Point-to-point and collective communication among `size()` ranks. Buffers must stay valid
// (and unmodified, for inputs) until the returned handle's wait() returns, or, for work ordered
// on a stream after the handle's wait_on_stream(), until that work runs. Collectives are
// called by every rank in the same order. Reductions sum; they take fp32 or fp64 data.
// Portable use (the NCCL communicator, dpa/nccl.h, has no tags and unbuffered sends): a send
// may not complete before the peer posts the matching recv, so post every send and recv of an
// exchange before waiting on any; for each pair of ranks, post the receives in the order the
// peer posts the sends (then per-peer order and tags match alike); and receive every send
// before the next collective.
class DeviceCommunicator;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The device-buffer interface of this communicator, or nullptr when it moves host buffers.
  // Context parallelism keeps device tensors on the device through it.
  virtual DeviceCommunicator* device_communicator() { return nullptr; }

  virtual CommHandle send(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual CommHandle recv(void* data, size_t bytes, int peer, int tag) = 0;
  virtual CommHandle all_reduce(void* data, int64_t count, DType dtype) = 0;
  // recv holds size() blocks of `bytes_per_rank`, block r from rank r.
  virtual CommHandle all_gather(const void* send, void* recv, size_t bytes_per_rank) = 0;
  // send holds size() blocks of count_per_rank elements; recv gets the sum of every rank's
  // block rank().
  virtual CommHandle reduce_scatter(const void* send, void* recv, int64_t count_per_rank,
                                    DType dtype) = 0;
  // send block r goes to rank r; recv block r comes from rank r.
  virtual CommHandle all_to_all(const void* send, void* recv, size_t bytes_per_rank) = 0;
};

// A Communicator whose buffers are device pointers on one CUDA device: the NCCL communicator
// (dpa/nccl.h, whose comment gives the ordering rules every implementation keeps) and the
// in-process group's device communicators. Work on the legacy default stream issued before an
// operation is posted is ordered before it; work on other streams must be finished, or be on
// stream(); after wait() returns, the data is ready for any stream.
class DeviceCommunicator : public Communicator {
 public:
  DeviceCommunicator* device_communicator() override { return this; }
  // Launches the queued point-to-point operations now (NCCL: one group).
  virtual void start_pending() = 0;
  // The cudaStream_t that operations are enqueued on.
  virtual void* stream() const = 0;
  virtual int device() const = 0;
  // Fails the communicator; later operations and waits throw with `reason`.
  virtual void abort(const std::string& reason) = 0;
  // False once an operation failed, timed out or abort() was called.
  virtual bool healthy() const = 0;
};

// Host buffers over a device communicator: every operation copies its host inputs to device
// memory on `device_comm`'s stream, runs there, and copies its outputs back to the host buffers
// when its wait() returns (the same rules as `device_comm` otherwise: matching, deferral,
// timeouts). Context parallelism's general algorithms exchange host buffers, so with CUDA
// tensors over a device communicator they run through this; a copy in and out per message is
// the price. `device_comm` must outlive the result and every handle it returns. Throws
// kNotSupported in a build without CUDA.
std::unique_ptr<Communicator> make_host_staged_communicator(DeviceCommunicator& device_comm);

// Device buffers over a host communicator: every operation copies its device input to host
// memory (after the work ordered before it, DeviceCommunicator's rules), runs on `host`, and
// copies its output to the device buffer when its wait() returns. Context parallelism gives
// CUDA tensors over a host communicator this view, so their tiles and chunk sets stay on the
// GPU and only the messages cross the host; the copies block the posting thread, so transfers
// do not overlap compute. `host` must outlive the result, and the result every handle it
// returns. abort() or a failed transfer fails the result, not `host`. A `host` that is a
// device communicator already is refused. Throws kNotSupported in a build without CUDA.
std::unique_ptr<DeviceCommunicator> make_host_bounced_communicator(Communicator& host, int device);

// N ranks as threads of one process, sharing a rendezvous object. The host communicators'
// sends are buffered, so a ring never deadlocks (the device communicators' are not, as over
// NCCL); a wait that exceeds `timeout`, or any rank calling abort(), makes every pending and
// later wait throw instead of hanging.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size,
                          std::chrono::milliseconds timeout = std::chrono::milliseconds(60000));
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int size() const;
  // The communicator of one rank; each rank (thread) uses its own.
  std::unique_ptr<Communicator> communicator(int rank);
  // The same rank's communicator over device buffers on CUDA device `device` (virtual ranks on
  // one GPU, to test the device algorithms there; every rank of a group on the same device): a
  // send and its receive are one device-to-device copy, enqueued by whichever rank posts second
  // on its own stream after both ranks' earlier work (events, no host staging); collectives
  // are run by the last rank to post, from a snapshot of every input. Sends are not buffered:
  // as over NCCL, post every send and receive of an exchange before waiting on any (a wait
  // that breaks the rule fails at the group's timeout). Use one per rank and thread. Throws
  // kNotSupported in a build without CUDA.
  std::unique_ptr<DeviceCommunicator> device_communicator(int rank, int device);
  // Fails every pending and future operation of the group with `reason`.
  void abort(const std::string& reason);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// Runs fn(rank, communicator) on `size` threads. The first exception aborts the group (so the
// other ranks stop waiting) and is rethrown after every thread has finished.
void run_in_process(int size, const std::function<void(int, Communicator&)>& fn,
                    std::chrono::milliseconds timeout = std::chrono::milliseconds(60000));
// The same with each rank's device communicator on CUDA device `device`.
void run_in_process_on_device(int size, int device,
                              const std::function<void(int, DeviceCommunicator&)>& fn,
                              std::chrono::milliseconds timeout = std::chrono::milliseconds(60000));

// ---- Sharding (DESIGN.md §8) ----
// Load balance for causal masks: a sequence of length s (a multiple of 2*cp) is cut into 2*cp
// chunks of s / (2*cp); rank r holds chunks r and 2*cp-1-r, in that order.

// The unsharded positions of rank r's local rows, in local order ([s / cp] entries).
std::vector<int64_t> dual_chunk_positions(int64_t seqlen, int cp, int rank);

// thd: each sequence is padded to a multiple of 2*cp and split like one bshd sequence.
struct ThdCpPartition {
  std::vector<int32_t> cu_seqlens;  // [b + 1] the actual lengths (unchanged)
  std::vector<int32_t>
      cu_seqlens_padded;                 // [b + 1] unsharded offsets, each slot a multiple of 2*cp
  std::vector<int32_t> local_cu_padded;  // [b + 1] cu_seqlens_padded / cp: a rank's local slots
};
ThdCpPartition thd_cp_partition(const std::vector<int32_t>& lengths, int cp);

// Copies the rank's shard of `full` into `local` (dual-chunk split along the sequence axis of
// a q/k/v/o-like tensor in `format`), or back (unshard). thd needs the partition's
// cu_seqlens_padded (the unsharded row offsets); `full` is then [cu_padded.back(), H, d].
void shard_sequence(const TensorView& full, const TensorView& local, Format format, int cp,
                    int rank, const std::vector<int32_t>& cu_seqlens_padded = {});
void unshard_sequence(const TensorView& local, const TensorView& full, Format format, int cp,
                      int rank, const std::vector<int32_t>& cu_seqlens_padded = {});
// The same for an LSE tensor ([b, H, s], or thd [H, t]).
void shard_lse(const TensorView& full, const TensorView& local, Format format, int cp, int rank,
               const std::vector<int32_t>& cu_seqlens_padded = {});
void unshard_lse(const TensorView& local, const TensorView& full, Format format, int cp, int rank,
                 const std::vector<int32_t>& cu_seqlens_padded = {});

// Attention over a sharded sequence. Every tensor of ForwardArgs / BackwardArgs is this
// rank's shard in the dual-chunk layout (q, k, v, o, dO, dq, dk, dv; lse [b, H, s/cp] or thd
// [H, t/cp]). Sequence tables describe the UNSHARDED sequences: bshd/sbhd cu_seqlens_* give
// padding lengths (optional); thd needs cu_seqlens_* (actual lengths) and, unless every
// length is a multiple of 2*cp, cu_seqlens_*_padded from thd_cp_partition. softmax_offset
// and alibi_slopes are the full [H] tensors on every rank; dsoftmax_offset follows
// CpConfig::reduce_dalpha. bias and attn_mask (mask_type arbitrary) are the unsharded
// [b|1, H|1, Sq|1, Skv] tensors on every rank (Sq, Skv: the padded length for bshd / sbhd, the
// longest sequence for thd, as without CP); dbias has bias's shape and follows
// CpConfig::reduce_dbias.
class ContextParallelAttention {
 public:
  ContextParallelAttention(const AttentionConfig& config, const CpConfig& cp,
                           Communicator& communicator);

  // Both return the backend of this rank's tiles; where tiles took different backends, the
  // one furthest from the fast path (cuda_flash, cuda_unfused, cpu, cpu_exact). cpu_exact when
  // no tile of this rank sees a key.
  //
  // With CUDA tensors over a DeviceCommunicator (NCCL, an in-process group's device
  // communicators) a call returns once its work is enqueued on args.stream, as a single-GPU
  // call does: its outputs are ready for work enqueued there later (or after an event recorded
  // there), not yet for the host. The host waits for a call's transfers at a later call of this
  // object, once the device has finished them, or at synchronize(); a failed or timed-out
  // transfer throws there, naming the operation, before the later call has written anything
  // (a peer that never completes leaves the stream waiting until then, at most about 10 s after
  // the call returned, or 8 calls later). The host still waits where a call needs the device:
  // device sequence tables (cu_seqlens*) are read on the host after the caller's stream (tables
  // in host memory avoid that), and the first calls on an object, or a larger shape, grow its
  // device buffers. Calls with host tensors or over a host communicator return with their
  // outputs complete.
  ForwardResult forward(const ForwardArgs& args);
  BackendKind backward(const BackwardArgs& args);
  // Waits on the host until every call made through this object is complete, transfers
  // included; the first failure among them throws. The destructor waits too, silently.
  void synchronize();

  const AttentionConfig& config() const { return config_; }
  const CpConfig& cp_config() const { return cp_; }

 private:
  AttentionConfig config_;
  CpConfig cp_;
  Communicator& comm_;
  uint64_t next_offset_ = 0;
  // Device buffers of the device ring (an NcclCommunicator), kept between calls; copies of the
  // object share them (use one object per thread).
  std::shared_ptr<cp::RingWorkspace> ring_workspace_;
  // Device calls whose transfers the host has not waited for (cp/calls_in_flight.h). Declared
  // after the workspace, so destroyed (waiting for them) before it.
  std::shared_ptr<cp::CallsInFlight> calls_in_flight_;
};

}  // namespace dpa
