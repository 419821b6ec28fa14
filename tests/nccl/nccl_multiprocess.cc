// Multi-process tests of the NCCL communicator (include/dpa/nccl.h), one process per GPU.
//
//   dpa_nccl_tests --nproc N   launcher: forks and execs N workers of this binary with RANK,
//                              WORLD_SIZE, LOCAL_RANK and a fresh DPA_NCCL_ID_FILE; skips
//                              (exit 0, "skipped") without N GPUs. scripts/nccl_test.sh runs it.
//   dpa_nccl_tests             worker, under torchrun / mpirun / srun (env recipe, docs/nccl.md)
//
// Every value is checked on the host: byte patterns that depend on (source, destination, what,
// index), so a block from the wrong rank or a message matched to the wrong receive shows up;
// reductions of small integers, exact in fp32. Then context parallelism over NCCL
// (nccl_cp.cc): every CP configuration and comm type against the single-GPU result, and with
// --cp-bench the scaling benchmark. The last phase kills one rank and checks that
// every other rank gets a dpa::Error within the timeout instead of hanging.
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda/runtime.h"
#include "dpa/error.h"
#include "dpa/nccl.h"
#include "nccl/nccl_cp.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using dpa::CommHandle;
using dpa::DType;
using dpa::NcclCommunicator;

constexpr const char* kName = "dpa_nccl_tests";

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(bool ok, const std::string& message) {
  if (!ok) throw Failure(message);
}

void cuda_check(cudaError_t error, const char* what) {
  if (error != cudaSuccess)
    throw Failure(std::string(what) + ": " + cudaGetErrorName(error) + " " +
                  cudaGetErrorString(error));
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A byte that depends on everything that identifies it.
uint8_t pattern(int source, int destination, int what, size_t index) {
  uint64_t x = (uint64_t(source) << 48) ^ (uint64_t(destination) << 32) ^ (uint64_t(what) << 24) ^
               (uint64_t(index) * 0x9E3779B97F4A7C15ull);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return uint8_t(x);
}

std::vector<uint8_t> pattern_bytes(int source, int destination, int what, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = pattern(source, destination, what, i);
  return out;
}

// Bytes on this process's GPU (owned by a dpa::cuda::DeviceMemory).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    int device = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    memory_ = dpa::cuda::DeviceMemory(bytes ? bytes : 1, device);
    // Poison: a receive that never lands reads as 0xA5, not as a stale right answer.
    cuda_check(cudaMemset(get(), 0xA5, bytes ? bytes : 1), "cudaMemset");
  }
  void* get() const { return memory_.get(); }
  size_t bytes() const { return bytes_; }
  template <typename T>
  void upload(const std::vector<T>& host) {
    check(host.size() * sizeof(T) == bytes_, "upload size");
    cuda_check(cudaMemcpy(get(), host.data(), bytes_, cudaMemcpyHostToDevice), "upload");
  }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    cuda_check(cudaMemcpy(host.data(), get(), bytes_, cudaMemcpyDeviceToHost), "download");
    return host;
  }

 private:
  size_t bytes_ = 0;
  dpa::cuda::DeviceMemory memory_;
};

void expect_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                  const std::string& what) {
  check(got.size() == want.size(), what + ": size");
  for (size_t i = 0; i < got.size(); ++i)
    check(got[i] == want[i], what + ": byte " + std::to_string(i) + " is " +
                                 std::to_string(got[i]) + ", expected " + std::to_string(want[i]));
}

void wait_all(std::vector<CommHandle>& handles) {
  for (CommHandle& handle : handles) handle->wait();
  handles.clear();
}

// ---- Cases ----

// The ring of cp_attention.cc's ring_exchange: two messages of different sizes to the next
// rank, two from the previous one, in the same tag order; waits in an unrelated order.
void ring(NcclCommunicator& comm, bool start_early, bool receives_first) {
  const int r = comm.rank(), n = comm.size();
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  const size_t size_a = 1001, size_b = 3 * 65536 + 5;
  DeviceBuffer send_a(size_a), send_b(size_b), recv_a(size_a), recv_b(size_b);
  send_a.upload(pattern_bytes(r, next, 1, size_a));
  send_b.upload(pattern_bytes(r, next, 2, size_b));
  std::vector<CommHandle> handles;
  if (receives_first) {
    handles.push_back(comm.recv(recv_a.get(), size_a, prev, 10));
    handles.push_back(comm.recv(recv_b.get(), size_b, prev, 11));
  }
  handles.push_back(comm.send(send_a.get(), size_a, next, 10));
  handles.push_back(comm.send(send_b.get(), size_b, next, 11));
  if (!receives_first) {
    handles.push_back(comm.recv(recv_a.get(), size_a, prev, 10));
    handles.push_back(comm.recv(recv_b.get(), size_b, prev, 11));
  }
  if (start_early) comm.start_pending();
  for (size_t i = handles.size(); i-- > 0;) handles[i]->wait();
  expect_bytes(recv_a.download<uint8_t>(), pattern_bytes(prev, r, 1, size_a), "ring message a");
  expect_bytes(recv_b.download<uint8_t>(), pattern_bytes(prev, r, 2, size_b), "ring message b");
}

// cp_attention's backward: the KV exchange of the next step is in flight while the dKV
// exchange is posted and waited; four messages per pair, matched by posting order.
void overlapping_rings(NcclCommunicator& comm) {
  const int r = comm.rank(), n = comm.size();
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  const size_t sizes[4] = {4096, 4100, 8192 + 4, 3};  // k, v (input dtype), dk, dv (fp32)
  std::vector<std::unique_ptr<DeviceBuffer>> out, in;
  for (int m = 0; m < 4; ++m) {
    out.push_back(std::make_unique<DeviceBuffer>(sizes[m]));
    in.push_back(std::make_unique<DeviceBuffer>(sizes[m]));
    out.back()->upload(pattern_bytes(r, next, 20 + m, sizes[m]));
  }
  std::vector<CommHandle> kv, dkv;
  for (int m = 0; m < 2; ++m) kv.push_back(comm.send(out[m]->get(), sizes[m], next, 10 + m));
  for (int m = 0; m < 2; ++m) kv.push_back(comm.recv(in[m]->get(), sizes[m], prev, 10 + m));
  for (int m = 2; m < 4; ++m) dkv.push_back(comm.send(out[m]->get(), sizes[m], next, 18 + m));
  for (int m = 2; m < 4; ++m) dkv.push_back(comm.recv(in[m]->get(), sizes[m], prev, 18 + m));
  wait_all(dkv);
  wait_all(kv);
  for (int m = 0; m < 4; ++m)
    expect_bytes(in[m]->download<uint8_t>(), pattern_bytes(prev, r, 20 + m, sizes[m]),
                 "overlapping ring message " + std::to_string(m));
}

void all_reduce(NcclCommunicator& comm, int64_t count) {
  const int r = comm.rank(), n = comm.size();
  std::vector<float> host(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) host[size_t(i)] = float(r + 1) + float(i % 7);
  DeviceBuffer data(host.size() * sizeof(float));
  data.upload(host);
  comm.all_reduce(data.get(), count, DType::kFloat32)->wait();
  const std::vector<float> got = data.download<float>();
  for (int64_t i = 0; i < count; ++i) {
    const float want = float(n * (n + 1) / 2) + float(n) * float(i % 7);
    check(got[size_t(i)] == want, "all_reduce fp32 element " + std::to_string(i) + " is " +
                                      std::to_string(got[size_t(i)]) + ", expected " +
                                      std::to_string(want));
  }
  // fp64, in place, an odd count.
  std::vector<double> host64(17);
  for (size_t i = 0; i < host64.size(); ++i) host64[i] = 0.5 * (r + 1) + double(i);
  DeviceBuffer data64(host64.size() * sizeof(double));
  data64.upload(host64);
  comm.all_reduce(data64.get(), int64_t(host64.size()), DType::kFloat64)->wait();
  const std::vector<double> got64 = data64.download<double>();
  for (size_t i = 0; i < got64.size(); ++i)
    check(got64[i] == 0.25 * n * (n + 1) + double(n) * double(i),
          "all_reduce fp64 element " + std::to_string(i));
}

void all_gather(NcclCommunicator& comm) {
  const int r = comm.rank(), n = comm.size();
  const size_t block = 333;
  DeviceBuffer send(block), recv(block * size_t(n));
  send.upload(pattern_bytes(r, 0, 3, block));
  comm.all_gather(send.get(), recv.get(), block)->wait();
  const std::vector<uint8_t> got = recv.download<uint8_t>();
  for (int s = 0; s < n; ++s)
    expect_bytes(
        std::vector<uint8_t>(got.begin() + long(s * block), got.begin() + long((s + 1) * block)),
        pattern_bytes(s, 0, 3, block), "all_gather block " + std::to_string(s));
}

void reduce_scatter(NcclCommunicator& comm) {
  const int r = comm.rank(), n = comm.size();
  const int64_t per_rank = 257;
  std::vector<float> host(size_t(per_rank * n));
  for (int b = 0; b < n; ++b)
    for (int64_t i = 0; i < per_rank; ++i)
      host[size_t(b * per_rank + i)] = float((r + 1) * (b + 1)) + float(i % 5);
  DeviceBuffer send(host.size() * sizeof(float)), recv(size_t(per_rank) * sizeof(float));
  send.upload(host);
  comm.reduce_scatter(send.get(), recv.get(), per_rank, DType::kFloat32)->wait();
  const std::vector<float> got = recv.download<float>();
  for (int64_t i = 0; i < per_rank; ++i) {
    const float want = float((r + 1) * n * (n + 1) / 2) + float(n) * float(i % 5);
    check(got[size_t(i)] == want, "reduce_scatter element " + std::to_string(i) + " is " +
                                      std::to_string(got[size_t(i)]) + ", expected " +
                                      std::to_string(want));
  }
}

void all_to_all(NcclCommunicator& comm) {
  const int r = comm.rank(), n = comm.size();
  const size_t block = 129;
  std::vector<uint8_t> host;
  for (int d = 0; d < n; ++d) {
    const std::vector<uint8_t> part = pattern_bytes(r, d, 4, block);
    host.insert(host.end(), part.begin(), part.end());
  }
  DeviceBuffer send(host.size()), recv(host.size());
  send.upload(host);
  comm.all_to_all(send.get(), recv.get(), block)->wait();
  const std::vector<uint8_t> got = recv.download<uint8_t>();
  for (int s = 0; s < n; ++s)
    expect_bytes(
        std::vector<uint8_t>(got.begin() + long(s * block), got.begin() + long((s + 1) * block)),
        pattern_bytes(s, r, 4, block), "all_to_all block from rank " + std::to_string(s));
}

// Point-to-point posted before a collective is launched before it (and stays matched).
void p2p_then_collective(NcclCommunicator& comm) {
  const int r = comm.rank(), n = comm.size();
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  const size_t bytes = 777;
  DeviceBuffer out(bytes), in(bytes), sum(sizeof(double));
  out.upload(pattern_bytes(r, next, 5, bytes));
  sum.upload(std::vector<double>{double(r)});
  CommHandle s = comm.send(out.get(), bytes, next, 0);
  CommHandle v = comm.recv(in.get(), bytes, prev, 0);
  CommHandle reduce = comm.all_reduce(sum.get(), 1, DType::kFloat64);
  reduce->wait();
  v->wait();
  s->wait();
  expect_bytes(in.download<uint8_t>(), pattern_bytes(prev, r, 5, bytes), "p2p before collective");
  check(sum.download<double>()[0] == double(n * (n - 1) / 2), "all_reduce after p2p");
}

// Bad arguments throw before any communication and leave the communicator usable.
void argument_errors(NcclCommunicator& comm) {
  DeviceBuffer buffer(64);
  auto code_of = [](auto fn) {
    try {
      fn();
    } catch (const dpa::Error& error) {
      return error.argument();
    }
    return std::string("<nothing thrown>");
  };
  check(code_of([&] { comm.send(buffer.get(), 8, comm.size(), 0); }) == "peer", "bad peer");
  check(code_of([&] { comm.all_reduce(buffer.get(), 4, DType::kFloat16); }) == "dtype",
        "fp16 reduction");
  comm.send(buffer.get(), 0, (comm.rank() + 1) % comm.size(), 0)->wait();  // zero bytes: done
  check(comm.healthy(), "healthy after argument errors");
}

// ---- Worker ----

struct WorkerSettings {
  std::string id_file, id_key;
  std::chrono::milliseconds dead_peer_timeout{5000};
  bool dead_peer = true;
  int64_t cp_seqlen = 2048;  // DPA_NCCL_TEST_CP_SEQLEN (--cp-seqlen); 0 skips the CP phase
  int64_t cp_bench = 0;      // DPA_NCCL_TEST_CP_BENCH (--cp-bench): tokens per GPU
  // DPA_NCCL_TEST_CP_ONLY=1 (--cp-only): the CP phases alone, e.g. under compute-sanitizer,
  // which flags NCCL's own reads past the odd-sized messages of the communicator phases.
  bool cp_only = false;
  bool cp_ring_only = false;     // DPA_NCCL_TEST_CP_RING_ONLY=1 (--cp-ring-only)
  bool cp_bench_staged = false;  // DPA_NCCL_TEST_CP_BENCH_STAGED=1
};

void log(int rank, const std::string& message) {
  std::printf("%s: rank %d: %s\n", kName, rank, message.c_str());
  std::fflush(stdout);
}

template <typename Fn>
void run_case(NcclCommunicator& comm, const char* name, Fn fn) {
  const auto start = Clock::now();
  fn();
  if (comm.rank() == 0)
    log(0, std::string(name) + " ok (" + std::to_string(seconds(Clock::now() - start)) + " s)");
}

void main_communicator(const WorkerSettings&) {
  std::unique_ptr<NcclCommunicator> comm = dpa::make_nccl_communicator_from_env(60000ms);
  NcclCommunicator& c = *comm;
  if (c.size() >= 2) {
    run_case(c, "ring (start_pending)", [&] { ring(c, true, false); });
    run_case(c, "ring (launched by wait)", [&] { ring(c, false, false); });
    run_case(c, "ring (receives posted first)", [&] { ring(c, false, true); });
    run_case(c, "overlapping rings", [&] { overlapping_rings(c); });
    run_case(c, "p2p then collective", [&] { p2p_then_collective(c); });
  }
  run_case(c, "all_reduce", [&] { all_reduce(c, 1003); });
  run_case(c, "all_reduce 1M", [&] { all_reduce(c, 1 << 20); });
  run_case(c, "all_gather", [&] { all_gather(c); });
  run_case(c, "reduce_scatter", [&] { reduce_scatter(c); });
  run_case(c, "all_to_all", [&] { all_to_all(c); });
  run_case(c, "argument errors", [&] { argument_errors(c); });
  run_case(c, "many small ops", [&] {
    for (int i = 0; i < 50; ++i) all_reduce(c, 5);
  });
  check(c.healthy(), "main communicator healthy at the end");
}

// The caller-passes-the-id bootstrap, on a caller's stream: rank 0 makes the id and hands it
// over (here through an id file the test itself writes; MPI_Bcast in real use).
void id_bytes_communicator(const WorkerSettings& settings, const dpa::LaunchEnv& env, int device) {
  const std::string path = settings.id_file + ".bytes";
  std::vector<uint8_t> id;
  if (env.rank == 0) {
    id = dpa::nccl_unique_id();
    dpa::write_nccl_id_file(path, id, settings.id_key);
  } else {
    id = dpa::read_nccl_id_file(path, 60000ms, settings.id_key);
  }
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  {
    std::unique_ptr<NcclCommunicator> comm = dpa::make_nccl_communicator(
        env.rank, env.size, device, dpa::NcclBootstrap::from_id(id), 60000ms, stream);
    check(comm->stream() == stream, "communicator uses the caller's stream");
    run_case(*comm, "id bytes + caller stream: all_reduce", [&] { all_reduce(*comm, 4099); });
  }
  if (env.rank == 0) std::filesystem::remove(path);
  cudaStreamDestroy(stream);
}

// One rank leaves without a word; every other rank must get a dpa::Error within the timeout.
void dead_peer(const WorkerSettings& settings, const dpa::LaunchEnv& env, int device) {
  const std::chrono::milliseconds timeout = settings.dead_peer_timeout;
  std::unique_ptr<NcclCommunicator> comm = dpa::make_nccl_communicator(
      env.rank, env.size, device,
      dpa::NcclBootstrap::from_file(settings.id_file + ".dead", settings.id_key), timeout);
  all_reduce(*comm, 64);  // everyone is here
  const int victim = env.size - 1;
  const std::string ready = settings.id_file + ".ready.";
  if (env.rank == victim) {
    // Leave once every survivor has finished that sync (so its data was delivered) and is about
    // to wait on an all_reduce that needs this rank: their kernels are running when it dies.
    const auto deadline = Clock::now() + 30s;
    for (int r = 0; r < victim; ++r)
      while (!std::filesystem::exists(ready + std::to_string(r)) && Clock::now() < deadline)
        std::this_thread::sleep_for(10ms);
    std::this_thread::sleep_for(500ms);
    log(env.rank, "dead peer: leaving now without cleanup");
    std::_Exit(0);
  }
  DeviceBuffer buffer(256);
  const auto start = Clock::now();
  const std::string expected_op = "all_reduce";
  try {
    std::ofstream(ready + std::to_string(env.rank)) << "ready\n";
    comm->all_reduce(buffer.get(), 64, DType::kFloat32)->wait();
    throw Failure("dead peer: the operation completed although rank " + std::to_string(victim) +
                  " is gone");
  } catch (const dpa::Error& error) {
    const double elapsed = seconds(Clock::now() - start);
    const std::string what = error.what();
    log(env.rank, "dead peer: threw after " + std::to_string(elapsed) + " s: " + what);
    check(error.code() == dpa::ErrorCode::kBackendFailure, "dead peer: error code");
    check(error.argument() == "communicator", "dead peer: error argument");
    check(what.find(expected_op) != std::string::npos,
          "dead peer: the message names '" + expected_op + "'");
    // The deadline plus what ncclCommAbort may take; far below a hang.
    const double bound = seconds(timeout) + 30.0;
    check(elapsed <= bound, "dead peer: took " + std::to_string(elapsed) + " s, bound " +
                                std::to_string(bound) + " s");
  }
  check(!comm->healthy(), "dead peer: communicator marked unhealthy");
  const auto again = Clock::now();
  try {
    comm->all_reduce(buffer.get(), 64, DType::kFloat32)->wait();
    throw Failure("dead peer: an aborted communicator accepted an operation");
  } catch (const dpa::Error& error) {
    check(std::string(error.what()).find("aborted earlier") != std::string::npos,
          "dead peer: later operations say the communicator was aborted");
  }
  check(Clock::now() - again < 1s, "dead peer: later operations fail at once");
  std::filesystem::remove(ready + std::to_string(env.rank));
  if (env.rank == 0) log(0, "dead peer ok");
}

int worker(const WorkerSettings& settings) {
  std::optional<dpa::LaunchEnv> env;
  try {
    env = dpa::launch_env();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", kName, error.what());
    return 2;
  }
  if (!env) {
    std::fprintf(stderr, "%s: no RANK/WORLD_SIZE (or mpirun/srun) environment\n", kName);
    return 2;
  }
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    log(env->rank, std::string("skipped: no usable CUDA device (") +
                       (status == cudaSuccess ? "none" : cudaGetErrorString(status)) + ")");
    std::printf("%s: skipped\n", kName);
    return 0;
  }
  try {
    const dpa::NcclEnvConfig config = dpa::nccl_env_config_from(
        [](const char* name) -> const char* { return std::getenv(name); }, 60000ms);
    if (config.device >= count) {  // e.g. torchrun with more local ranks than GPUs
      log(env->rank, "skipped: rank needs CUDA device " + std::to_string(config.device) +
                         ", this machine has " + std::to_string(count));
      std::printf("%s: skipped\n", kName);
      return 0;
    }
    // Every buffer of this rank lives on its GPU.
    cuda_check(cudaSetDevice(config.device), "cudaSetDevice");
    if (!settings.cp_only) {
      main_communicator(settings);
      id_bytes_communicator(settings, config.launch, config.device);
    }
    dpa::nccl_test::CpPhaseSettings cp;
    cp.id_file = settings.id_file + ".cp";
    cp.id_key = settings.id_key;
    cp.seqlen = settings.cp_seqlen;
    cp.bench_seqlen_per_gpu = settings.cp_bench;
    cp.ring_only = settings.cp_ring_only;
    cp.bench_staged = settings.cp_bench_staged;
    dpa::nccl_test::run_cp_correctness(config.launch, config.device, cp);
    if (cp.seqlen > 0 && env->rank == 0) log(0, "context parallelism over NCCL ok");
    dpa::nccl_test::run_cp_scaling(config.launch, config.device, cp);
    if (settings.dead_peer && env->size >= 2) dead_peer(settings, config.launch, config.device);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: rank %d: FAILED: %s\n", kName, env->rank, error.what());
    return 1;
  }
  log(env->rank, "passed");
  return 0;
}

// ---- Launcher ----

int launch(int nproc, int deadline_s, bool dead_peer) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count < nproc) {
    std::printf("%s: skipped: %d ranks need %d GPUs, %d visible%s%s\n", kName, nproc, nproc,
                status == cudaSuccess ? count : 0, status == cudaSuccess ? "" : ": ",
                status == cudaSuccess ? "" : cudaGetErrorString(status));
    return 0;
  }
  char self[4096];
  const ssize_t length = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (length <= 0) {
    std::perror("readlink /proc/self/exe");
    return 1;
  }
  self[length] = '\0';
  const char* tmp = std::getenv("TMPDIR");
  std::string dir_template = std::string(tmp && *tmp ? tmp : "/tmp") + "/dpa_nccl.XXXXXX";
  std::vector<char> dir_buffer(dir_template.begin(), dir_template.end());
  dir_buffer.push_back('\0');
  if (::mkdtemp(dir_buffer.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = dir_buffer.data();
  const std::string id_file = dir + "/id";
  const std::string key = "dpa-nccl-test-" + std::to_string(::getpid());

  // Everything the child needs is built before fork: between fork and exec a child of a
  // process with threads (the CUDA runtime's) may only make async-signal-safe calls.
  const char* const overridden[] = {
      "RANK=",           "WORLD_SIZE=", "LOCAL_RANK=", "DPA_NCCL_ID_FILE=", "DPA_NCCL_ID_KEY=",
      "DPA_NCCL_DEVICE="};
  std::vector<std::string> inherited;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    bool keep = true;
    for (const char* prefix : overridden)
      if (std::strncmp(*entry, prefix, std::strlen(prefix)) == 0) keep = false;
    if (keep) inherited.push_back(*entry);
  }
  std::vector<std::vector<std::string>> environments;
  for (int rank = 0; rank < nproc; ++rank) {
    std::vector<std::string> env = inherited;
    env.push_back("RANK=" + std::to_string(rank));
    env.push_back("WORLD_SIZE=" + std::to_string(nproc));
    env.push_back("LOCAL_RANK=" + std::to_string(rank));
    env.push_back("DPA_NCCL_ID_FILE=" + id_file);
    env.push_back("DPA_NCCL_ID_KEY=" + key);
    environments.push_back(std::move(env));
  }
  std::vector<std::vector<char*>> envps;
  for (std::vector<std::string>& env : environments) {
    std::vector<char*> envp;
    for (std::string& entry : env) envp.push_back(entry.data());
    envp.push_back(nullptr);
    envps.push_back(std::move(envp));
  }
  char worker_flag[] = "--worker";
  char no_dead_peer[] = "--no-dead-peer";
  char* argv[] = {self, worker_flag, dead_peer ? nullptr : no_dead_peer, nullptr};

  std::vector<pid_t> children;
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      break;
    }
    if (pid == 0) {
      ::execve(self, argv, envps[size_t(rank)].data());
      ::_exit(127);
    }
    children.push_back(pid);
  }

  // Wait for every worker, with an overall deadline: a hang is a failure, not a stuck CI.
  const auto deadline = Clock::now() + std::chrono::seconds(deadline_s);
  std::vector<int> codes(children.size(), -1);
  size_t running = children.size();
  bool timed_out = false;
  while (running > 0) {
    for (size_t i = 0; i < children.size(); ++i) {
      if (codes[i] != -1) continue;
      int wstatus = 0;
      if (::waitpid(children[i], &wstatus, WNOHANG) == children[i]) {
        codes[i] = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        --running;
      }
    }
    if (running > 0 && Clock::now() >= deadline) {
      timed_out = true;
      for (size_t i = 0; i < children.size(); ++i)
        if (codes[i] == -1) ::kill(children[i], SIGKILL);
      for (size_t i = 0; i < children.size(); ++i)
        if (codes[i] == -1) {
          ::waitpid(children[i], nullptr, 0);
          codes[i] = 128 + SIGKILL;
        }
      running = 0;
    }
    if (running > 0) std::this_thread::sleep_for(20ms);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);

  bool ok = children.size() == size_t(nproc) && !timed_out;
  for (size_t i = 0; i < codes.size(); ++i)
    if (codes[i] != 0) {
      std::fprintf(stderr, "%s: rank %zu exited with %d\n", kName, i, codes[i]);
      ok = false;
    }
  if (timed_out) std::fprintf(stderr, "%s: killed workers after %d s\n", kName, deadline_s);
  std::printf("%s: %s (%d ranks)\n", kName, ok ? "passed" : "FAILED", nproc);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int nproc = 0, deadline_s = 300;
  bool worker_mode = false;
  WorkerSettings settings;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--nproc" && i + 1 < argc) {
      nproc = std::atoi(argv[++i]);
    } else if (arg == "--deadline-s" && i + 1 < argc) {
      deadline_s = std::atoi(argv[++i]);
    } else if (arg == "--worker") {
      worker_mode = true;
    } else if (arg == "--no-dead-peer") {
      settings.dead_peer = false;
    } else if (arg == "--cp-ring-only") {
      setenv("DPA_NCCL_TEST_CP_RING_ONLY", "1", 1);
    } else if (arg == "--cp-only") {
      setenv("DPA_NCCL_TEST_CP_ONLY", "1", 1);
    } else if ((arg == "--cp-seqlen" || arg == "--cp-bench") && i + 1 < argc) {
      // Through the environment, so that the workers (and torchrun's) see it too.
      setenv(arg == "--cp-seqlen" ? "DPA_NCCL_TEST_CP_SEQLEN" : "DPA_NCCL_TEST_CP_BENCH", argv[++i],
             1);
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--nproc N] [--deadline-s S] [--no-dead-peer] [--cp-seqlen S]\n"
          "          [--cp-bench TOKENS_PER_GPU] [--cp-ring-only] [--cp-only]   (launcher)\n"
          "       %s [--no-dead-peer]   (worker, under torchrun/mpirun/srun)\n"
          "  --cp-seqlen: unsharded length of the CP configurations (default 2048, 0 "
          "skips them)\n"
          "  --cp-bench: run the CP scaling benchmark with this many tokens per GPU\n"
          "  --cp-ring-only: run only the CP configurations the device ring takes\n"
          "  --cp-only: skip the communicator phases (before the CP phases)\n",
          argv[0], argv[0]);
      return 2;
    }
  }
  if (nproc < 0 || deadline_s < 1) return 2;
  if (!worker_mode && nproc == 0 && std::getenv("RANK") == nullptr &&
      std::getenv("OMPI_COMM_WORLD_RANK") == nullptr && std::getenv("SLURM_PROCID") == nullptr)
    nproc = 2;  // run by hand or by CTest: launch two workers
  if (nproc > 0 && !worker_mode) return launch(nproc, deadline_s, settings.dead_peer);
  if (const char* file = std::getenv("DPA_NCCL_ID_FILE")) settings.id_file = file;
  if (const char* key = std::getenv("DPA_NCCL_ID_KEY"))
    settings.id_key = key;
  else if (const char* run_id = std::getenv("TORCHELASTIC_RUN_ID"))
    settings.id_key = run_id;
  if (const char* ms = std::getenv("DPA_NCCL_TEST_DEAD_PEER_TIMEOUT_MS"))
    settings.dead_peer_timeout = std::chrono::milliseconds(std::atol(ms));
  if (const char* seqlen = std::getenv("DPA_NCCL_TEST_CP_SEQLEN"))
    settings.cp_seqlen = std::atoll(seqlen);
  if (const char* tokens = std::getenv("DPA_NCCL_TEST_CP_BENCH"))
    settings.cp_bench = std::atoll(tokens);
  auto flag = [](const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr && std::string(value) == "1";
  };
  settings.cp_only = flag("DPA_NCCL_TEST_CP_ONLY");
  settings.cp_ring_only = flag("DPA_NCCL_TEST_CP_RING_ONLY");
  settings.cp_bench_staged = flag("DPA_NCCL_TEST_CP_BENCH_STAGED");
  return worker(settings);
}
