// A Communicator that hands every operation to another one: tests derive from it and override
// the operation they watch or change.
#pragma once

#include "dpa/cp.h"

namespace dpa::test {

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  CommHandle send(const void* data, size_t bytes, int peer, int tag) override {
    return inner_.send(data, bytes, peer, tag);
  }
  CommHandle recv(void* data, size_t bytes, int peer, int tag) override {
    return inner_.recv(data, bytes, peer, tag);
  }
  CommHandle all_reduce(void* data, int64_t count, DType dtype) override {
    return inner_.all_reduce(data, count, dtype);
  }
  CommHandle all_gather(const void* send, void* recv, size_t bytes_per_rank) override {
    return inner_.all_gather(send, recv, bytes_per_rank);
  }
  CommHandle reduce_scatter(const void* send, void* recv, int64_t count_per_rank,
                            DType dtype) override {
    return inner_.reduce_scatter(send, recv, count_per_rank, dtype);
  }
  CommHandle all_to_all(const void* send, void* recv, size_t bytes_per_rank) override {
    return inner_.all_to_all(send, recv, bytes_per_rank);
  }

 protected:
  Communicator& inner() { return inner_; }

 private:
  Communicator& inner_;
};

}  // namespace dpa::test
