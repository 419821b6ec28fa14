// Caller-provided device scratch memory (DESIGN.md §11): one call's buffers come out of a block
// the caller allocated (PyTorch's caching allocator, say) instead of the driver's pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace dpa {

// Every buffer starts on this boundary (the widest vector access of any kernel is 16 bytes;
// 256 matches what cudaMalloc guarantees, so kernels see the alignment they always saw).
constexpr size_t kWorkspaceAlignment = 256;

// Bytes of a workspace that holds buffers of these sizes, each starting aligned.
size_t workspace_bytes_for(std::initializer_list<size_t> sizes);
size_t align_workspace(size_t bytes);

// A bump allocator over [data, data + bytes). Not thread-safe: one call's thread uses it.
class WorkspaceArena {
 public:
  WorkspaceArena(void* data, size_t bytes) : data_(static_cast<char*>(data)), bytes_(bytes) {}

  // An aligned block of `bytes`, or nullptr (and a recorded shortfall) when it does not fit.
  void* take(size_t bytes);
  size_t used() const { return used_; }
  size_t shortfall() const { return shortfall_; }

  // The arena active on this thread (nullptr when none).
  static WorkspaceArena* current();

 private:
  friend class WorkspaceScope;
  char* data_;
  size_t bytes_;
  size_t used_ = 0;
  size_t shortfall_ = 0;
};

// Makes `arena` the calling thread's current arena for the scope's lifetime.
class WorkspaceScope {
 public:
  explicit WorkspaceScope(WorkspaceArena* arena);
  ~WorkspaceScope();
  WorkspaceScope(const WorkspaceScope&) = delete;
  WorkspaceScope& operator=(const WorkspaceScope&) = delete;

 private:
  WorkspaceArena* previous_;
};

// Bytes that calls wanted beyond the workspace they were given, summed since the process
// started (each fell back to the driver's stream-ordered pool). Nonzero means a backend's
// workspace_bytes() undercounts: a bug the GPU tests look for.
uint64_t workspace_shortfall_bytes();

}  // namespace dpa
