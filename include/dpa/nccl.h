// The NCCL Communicator (DESIGN.md §8, docs/nccl.md): one process per GPU, buffers in device
// memory. This header needs neither CUDA nor NCCL headers; streams are passed as void*
// (cudaStream_t). When dpa is built without NCCL (DPA_NCCL=OFF) the bootstrap helpers still
// work and the factories throw ErrorCode::kNotSupported.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dpa/cp.h"

namespace dpa {

// True when this dpa was built with NCCL.
bool nccl_built();

// The size of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
constexpr size_t kNcclUniqueIdBytes = 128;

// ---- Launcher environment ----

// Where this process sits in a multi-process job.
struct LaunchEnv {
  int rank = 0;
  int size = 1;
  int local_rank = 0;    // rank among this node's processes (the default CUDA device), or -1
                         // when the launcher gives none
  std::string launcher;  // "torchrun", "openmpi" or "slurm": which variable set was read
};

// Reads the first complete variable set, in this order:
//   torchrun (and scripts/nccl_test.sh): RANK, WORLD_SIZE, LOCAL_RANK
//   OpenMPI mpirun:  OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//   Slurm srun:      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
// A missing local rank reads as 0 when size is 1, else -1. Returns nullopt when no rank variable
// of any set is present; throws kInvalidArgument naming the variable when a set is partial,
// not a decimal integer, or out of range (rank outside [0, size), size < 1).
using GetEnv = std::function<const char*(const char* name)>;
std::optional<LaunchEnv> launch_env_from(const GetEnv& getenv);
std::optional<LaunchEnv> launch_env();  // from this process's environment

// ---- The unique id through a shared file ----
// Rank 0 creates the id and writes it; every other rank polls the file. The path must be on a
// file system every rank sees (any local path for one node) and fresh for each job: a file
// left by an earlier job would hand out a dead id. `key`, when not empty, is written with the
// id and a reader accepts only a file with the same key (use the job id), which rejects such
// stale files. Rank 0 removes the file once the communicator is up (every rank has read it).
// make_nccl_communicator numbers the communicators a process creates through one path and
// appends "#n" to the key, so consecutive communicators may share a path.

// Writes atomically: a temporary file in the same directory, flushed, then renamed over
// `path`, so a reader sees either no file or the whole id. Throws kIo on failure.
void write_nccl_id_file(const std::string& path, const std::vector<uint8_t>& id,
                        const std::string& key = "");
// Polls (every few ms) until `path` holds an id with the given key; throws kBackendFailure
// (argument "communicator") when `timeout` passes first, saying what it found.
std::vector<uint8_t> read_nccl_id_file(const std::string& path, std::chrono::milliseconds timeout,
                                       const std::string& key = "");

// How the ranks agree on the ncclUniqueId. Exactly one of `unique_id` and `id_file` is set.
struct NcclBootstrap {
  std::vector<uint8_t> unique_id;  // kNcclUniqueIdBytes from nccl_unique_id() on one rank,
                                   // handed to every rank by the caller (MPI_Bcast, a store...)
  std::string id_file;             // rank 0 writes a fresh id here, the others read it
  std::string id_key;              // with id_file: see read_nccl_id_file

  static NcclBootstrap from_id(std::vector<uint8_t> id);
  static NcclBootstrap from_file(std::string path, std::string key = "");
};

// A fresh ncclUniqueId (ncclGetUniqueId). Throws kNotSupported without NCCL.
std::vector<uint8_t> nccl_unique_id();

// ---- The communicator ----
//
// Every operation is enqueued on one CUDA stream (the caller's, or one of its own) and returns
// at once; its handle's wait() polls the operation's CUDA event and ncclCommGetAsyncError until
// the operation completes, NCCL reports an error, or `timeout` passes (counted from the start
// of wait()). On an error or a timeout the communicator calls ncclCommAbort (which stops its
// kernels) and throws dpa::Error(kBackendFailure, "communicator", ...) naming the operation and
// the peer; from then on every operation and wait throws. So a dead or stuck peer becomes an
// error on every other rank within `timeout`, never a hang. Creation has the same deadline.
//
// Matching. NCCL has no tags: the k-th send from rank a to rank b meets the k-th recv on b
// from a, whatever the tags (they are accepted and ignored). Code that is correct for the
// in-process communicator stays correct here when (1) for every pair of ranks, the receiver
// posts its receives in the order the sender posted the sends (same tag sequence), and (2)
// point-to-point traffic between two ranks does not straddle a collective: every send posted
// before a collective is received before that collective on the peer. cp_attention.cc keeps
// both: all ranks run the same exchange code, and every exchange is posted and launched (and
// its stream ordered after it) before the next collective.
//
// Deferral. A send does not complete until the peer posts the matching recv (NCCL p2p blocks
// the GPU), and a ring in which each rank first sends and then receives deadlocks unless the
// two run in one ncclGroupStart/End. So send() and recv() only queue; the queue is launched as
// one group at the first wait() on any of its handles, before any collective, or at
// start_pending(). Post every send and recv of an exchange before waiting on any of them, and
// call start_pending() after posting to overlap the transfer with compute.
//
// Buffers are device pointers on `device` (checked: a host pointer is refused with
// kInvalidArgument) and must stay valid (inputs unmodified) until the handle's wait() returns
// (or, for a stream-ordered free or write, until the stream passed to wait_on_stream() runs it).
// Destroying a handle before its operation completed aborts the communicator (its buffers may
// be gone while NCCL still uses them). all_to_all is not in place: send and recv must not
// overlap. Work on the legacy default stream that was issued before an operation is posted is
// ordered before it (whatever stream the communicator uses); work on other streams must be
// finished, or be on the communicator's stream. After wait() returns, the data is ready for
// any stream.
// Zero-byte operations complete at once and move nothing (every rank must skip alike).
// A communicator and its handles are used from one thread. Destroying it drains the stream and
// finalizes NCCL within `timeout`, aborting instead when that fails; it never throws.
class NcclCommunicator : public DeviceCommunicator {};

// Creates this rank's communicator on CUDA device `device`. Every rank calls it with the same
// `size` and bootstrap; it returns when all `size` ranks have joined, and throws
// kBackendFailure (after ncclCommAbort) when that takes longer than `timeout`. `stream`: a
// cudaStream_t on `device` to enqueue on, or nullptr for a stream of its own. `device` becomes
// the calling thread's current CUDA device (one process per GPU wants it current anyway, and
// restoring a device the process never chose would create a context on GPU 0).
std::unique_ptr<NcclCommunicator> make_nccl_communicator(
    int rank, int size, int device, const NcclBootstrap& bootstrap,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(60000), void* stream = nullptr);

// The environment recipe (docs/nccl.md): rank, size and local rank from launch_env(), and
//   DPA_NCCL_ID_FILE    (required) the id file, e.g. a path in a directory shared by the job
//   DPA_NCCL_ID_KEY     (optional) key of the id file; default TORCHELASTIC_RUN_ID plus
//                       TORCHELASTIC_RESTART_COUNT (each restart is a new job), or
//                       SLURM_JOB_ID plus SLURM_STEP_ID, when set
//   DPA_NCCL_DEVICE     (optional) CUDA device; default the local rank
//   DPA_NCCL_TIMEOUT_MS (optional) overrides `default_timeout`
struct NcclEnvConfig {
  LaunchEnv launch;
  int device = 0;
  NcclBootstrap bootstrap;
  std::chrono::milliseconds timeout{60000};
};
// Throws kInvalidArgument naming the variable that is missing or malformed.
NcclEnvConfig nccl_env_config_from(const GetEnv& getenv, std::chrono::milliseconds default_timeout);
std::unique_ptr<NcclCommunicator> make_nccl_communicator_from_env(
    std::chrono::milliseconds default_timeout = std::chrono::milliseconds(60000),
    void* stream = nullptr);

}  // namespace dpa
