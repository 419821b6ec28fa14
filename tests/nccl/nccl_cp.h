// Context parallelism across processes over NCCL (issue 6): the phases dpa_nccl_tests runs
// after the communicator's own tests (nccl_multiprocess.cc).
#pragma once

#include <cstdint>
#include <string>

#include "dpa/nccl.h"

namespace dpa::nccl_test {

struct CpPhaseSettings {
  std::string id_file, id_key;  // bootstrap of the phase's communicator (its own file)
  int64_t seqlen = 0;           // unsharded sequence length of the correctness configs; 0 skips
  int64_t bench_seqlen_per_gpu = 0;  // scaling benchmark: tokens per GPU; 0 skips
  bool ring_only = false;            // only the configurations the device ring takes, through it
  bool bench_staged = false;         // the benchmark also times the host-staged path (3 runs)
};

// Every CP configuration of the context-parallelism issue under every comm type this world
// size allows (a2a+p2p on groups of 2 when the size is even and >= 4), forward and backward
// with CUDA tensors over NCCL (host-staged), each rank's outputs and gradients against its
// shard of the single-GPU result (the same call without CP on its own GPU). Throws on a
// mismatch. Every rank prints one line per (configuration, layout).
void run_cp_correctness(const LaunchEnv& env, int device, const CpPhaseSettings& settings);

// Forward + backward throughput per GPU with `bench_seqlen_per_gpu` tokens per GPU (causal,
// softcap 50, learnable sink, bf16, d = 128), for p2p at this world size against one GPU
// alone (20 runs each, host clock; the one-kernel backward opted in); rank 0 prints TFLOP/s per GPU
// and the efficiency against ideal scaling.
void run_cp_scaling(const LaunchEnv& env, int device, const CpPhaseSettings& settings);

}  // namespace dpa::nccl_test
