// Context parallelism from Python (DESIGN.md §8, docs/python.md): ContextParallelAttention over
// either dpa's NCCL communicator (bootstrapped by the package through a torch.distributed
// group) or a communicator whose operations a Python object carries out (the package's
// torch.distributed one: gloo on the host).
#include "context_parallel.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attention_calls.h"
#include "dpa/cp.h"
#include "dpa/nccl.h"

namespace nb = nanobind;

namespace dpa::python {
namespace {

// A pending operation of the Python communicator: an object with wait(), or None when the
// operation completed at once.
class PythonRequest final : public CommRequest {
 public:
  explicit PythonRequest(nb::object handle) : handle_(std::move(handle)) {}
  ~PythonRequest() override {
    nb::gil_scoped_acquire gil;
    handle_.reset();
  }
  void wait() override {
    nb::gil_scoped_acquire gil;
    if (!handle_.is_valid() || handle_.is_none()) return;
    nb::object handle = std::move(handle_);
    handle_ = nb::none();
    call_guarded("wait", [&] { handle.attr("wait")(); });
  }

  // Python errors become the communicator's kBackendFailure, as with every communicator.
  template <typename F>
  static void call_guarded(const char* operation, F&& f) {
    try {
      f();
    } catch (nb::python_error& error) {
      throw Error(ErrorCode::kBackendFailure, "communicator",
                  std::string(operation) + " failed: " + error.what());
    }
  }

 private:
  nb::object handle_;
};

// Communicator whose operations are the methods of a Python object (python/dpa/torch/
// context_parallel.py): send(ptr, nbytes, peer, tag), recv(...), all_reduce(ptr, count,
// dtype), all_gather(send_ptr, recv_ptr, nbytes_per_rank), reduce_scatter(send_ptr, recv_ptr,
// count_per_rank, dtype), all_to_all(send_ptr, recv_ptr, nbytes_per_rank); each returns an
// object with wait() or None. Buffers are host pointers. Called with the GIL released.
class PythonCommunicator final : public Communicator {
 public:
  PythonCommunicator(nb::object impl, int rank, int size)
      : impl_(std::move(impl)), rank_(rank), size_(size) {}
  ~PythonCommunicator() override {
    nb::gil_scoped_acquire gil;
    impl_.reset();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  CommHandle send(const void* data, size_t bytes, int peer, int tag) override {
    return call("send", address(data), bytes, peer, tag);
  }
  CommHandle recv(void* data, size_t bytes, int peer, int tag) override {
    return call("recv", address(data), bytes, peer, tag);
  }
  CommHandle all_reduce(void* data, int64_t count, DType dtype) override {
    return call("all_reduce", address(data), count, int(dtype));
  }
  CommHandle all_gather(const void* send, void* recv, size_t bytes_per_rank) override {
    return call("all_gather", address(send), address(recv), bytes_per_rank);
  }
  CommHandle reduce_scatter(const void* send, void* recv, int64_t count_per_rank,
                            DType dtype) override {
    return call("reduce_scatter", address(send), address(recv), count_per_rank, int(dtype));
  }
  CommHandle all_to_all(const void* send, void* recv, size_t bytes_per_rank) override {
    return call("all_to_all", address(send), address(recv), bytes_per_rank);
  }

 private:
  static uintptr_t address(const void* data) { return reinterpret_cast<uintptr_t>(data); }

  template <typename... Args>
  CommHandle call(const char* operation, Args... args) {
    nb::gil_scoped_acquire gil;
    nb::object handle;
    PythonRequest::call_guarded(operation, [&] { handle = impl_.attr(operation)(args...); });
    return std::make_unique<PythonRequest>(std::move(handle));
  }

  nb::object impl_;
  int rank_, size_;
};

// The NCCL communicator: this rank's, from a unique id every rank of the group received.
class NcclHandle {
 public:
  // `stream`: the cudaStream_t to enqueue on, 0 for a stream of the communicator's own.
  NcclHandle(const nb::bytes& unique_id, int rank, int size, int device, int64_t timeout_ms,
             uintptr_t stream) {
    std::vector<uint8_t> id(unique_id.size());
    std::memcpy(id.data(), unique_id.c_str(), id.size());
    nb::gil_scoped_release release;  // creation waits for every rank
    comm_ = make_nccl_communicator(rank, size, device, NcclBootstrap::from_id(std::move(id)),
                                   std::chrono::milliseconds(timeout_ms),
                                   reinterpret_cast<void*>(stream));
  }
  Communicator& communicator() { return *comm_; }

 private:
  std::unique_ptr<NcclCommunicator> comm_;
};

// The engine is built after the communicator it references; both live as long as this.
class ContextParallel : public Calls<ContextParallelAttention> {
 public:
  // `communicator`: an NcclCommunicator (NcclHandle), or the Python object of a
  // PythonCommunicator.
  ContextParallel(const AttentionConfig& config, const std::string& comm_type, int a2a_group_size,
                  bool reduce_dalpha, bool reduce_dbias, nb::object communicator, int rank,
                  int size)
      : Calls(nullptr), keep_(communicator) {
    CpConfig cp;
    std::optional<CpCommType> type = parse_cp_comm_type(comm_type);
    require(type.has_value(), "cp_comm_type",
            "has an unknown value '" + comm_type + "' (known: p2p, all_gather, a2a, a2a_p2p)");
    cp.comm_type = *type;
    cp.a2a_group_size = a2a_group_size;
    cp.reduce_dalpha = reduce_dalpha;
    cp.reduce_dbias = reduce_dbias;
    Communicator* comm = nullptr;
    if (nb::isinstance<NcclHandle>(communicator)) {
      comm = &nb::cast<NcclHandle&>(communicator).communicator();
    } else {
      python_comm_ = std::make_unique<PythonCommunicator>(communicator, rank, size);
      comm = python_comm_.get();
    }
    reset(std::make_unique<ContextParallelAttention>(config, cp, *comm));
  }
  ~ContextParallel() { reset(nullptr); }  // the engine goes before its communicator

  // Waits for every call of the engine, transfers included (ContextParallelAttention's calls
  // over NCCL return once enqueued); a failed or timed-out transfer raises here.
  void synchronize() {
    nb::gil_scoped_release release;
    engine().synchronize();
  }

 private:
  nb::object keep_;  // the NcclCommunicator object, when that is the communicator
  std::unique_ptr<PythonCommunicator> python_comm_;
};

}  // namespace

void bind_context_parallel(nb::module_& m) {
  m.def("nccl_built", &nccl_built);
  m.def("nccl_unique_id", [] {
    std::vector<uint8_t> id = nccl_unique_id();
    return nb::bytes(reinterpret_cast<const char*>(id.data()), id.size());
  });
  nb::class_<NcclHandle>(m, "NcclCommunicator")
      .def(nb::init<const nb::bytes&, int, int, int, int64_t, uintptr_t>(), nb::arg("unique_id"),
           nb::arg("rank"), nb::arg("size"), nb::arg("device"), nb::arg("timeout_ms"),
           nb::arg("stream"));
  nb::class_<ContextParallel> cp(m, "ContextParallel");
  cp.def(
      nb::init<const AttentionConfig&, const std::string&, int, bool, bool, nb::object, int, int>(),
      nb::arg("config"), nb::arg("comm_type"), nb::arg("a2a_group_size"), nb::arg("reduce_dalpha"),
      nb::arg("reduce_dbias"), nb::arg("communicator"), nb::arg("rank"), nb::arg("size"));
  add_call_methods(cp);
  cp.def("synchronize", &ContextParallel::synchronize);
}

}  // namespace dpa::python
