// A call's body run with the caller's workspace (dpa/arguments.h) as the thread's arena, shared
// by DotProductAttention and KvCacheAttention.
#pragma once

#include <cstdint>
#include <string>

#include "core/workspace.h"
#include "dpa/arguments.h"
#include "dpa/error.h"

namespace dpa {

// Runs `pass` inside a WorkspaceScope over the caller's block, or over what its allocator gave
// for `needed()` bytes (not called when the call needs none); without a workspace, just runs it.
// Errors name "workspace".
template <typename Needed, typename Run>
void run_in_workspace(const Workspace& workspace, Needed&& needed_bytes, Run&& pass) {
  if (!workspace.given()) return pass();
  const size_t needed = needed_bytes();
  void* data = workspace.data;
  size_t bytes = workspace.bytes;
  if (workspace.allocate) {
    if (needed == 0) return pass();
    data = workspace.allocate(needed);
    bytes = needed;
    require(data != nullptr, "workspace", "the allocator returned no memory");
  } else {
    require(bytes >= needed, "workspace", [&] {
      return "has " + std::to_string(bytes) + " bytes, the call needs " + std::to_string(needed) +
             " (workspace_size)";
    });
  }
  require(reinterpret_cast<uintptr_t>(data) % kWorkspaceAlignment == 0, "workspace", [&] {
    return "must start on a " + std::to_string(kWorkspaceAlignment) +
           "-byte boundary (as cudaMalloc's blocks do)";
  });
  WorkspaceArena arena(data, bytes);
  WorkspaceScope scope(&arena);
  pass();
}

}  // namespace dpa
