// A small persistent thread pool with one primitive: a blocking parallel-for over task indices.
//
// The tiled CPU backend splits its work into tasks that each own their outputs, so results
// never depend on which thread ran a task (bit-identical for any thread count). Several
// threads may call parallel_for at once (e.g. context-parallel ranks emulated by threads):
// their jobs share the workers, and every caller also works on its own job, so a call always
// makes progress even when all workers are busy elsewhere.
#pragma once

#include <cstdint>
#include <functional>

namespace dpa::cpu {

// Threads a parallel_for may use (the caller included): DPA_NUM_THREADS when set to a positive
// integer, else std::thread::hardware_concurrency(), further capped by set_num_threads.
int num_threads();

// Sets the threads used by later parallel_for calls (tests and benchmarks); the pool grows when
// asked for more threads than it has. 0 restores the default.
void set_num_threads(int threads);

// Runs body(0) .. body(count - 1), each exactly once, in any order and on any thread, and
// returns when all have finished. An exception thrown by a task is rethrown here (when several
// tasks run in parallel, after all of them have finished).
void parallel_for(int64_t count, const std::function<void(int64_t)>& body);

}  // namespace dpa::cpu
