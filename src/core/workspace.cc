#include "core/workspace.h"

#include <atomic>

namespace dpa {
namespace {

thread_local WorkspaceArena* current_arena = nullptr;
std::atomic<uint64_t> total_shortfall{0};

}  // namespace

size_t align_workspace(size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

size_t workspace_bytes_for(std::initializer_list<size_t> sizes) {
  size_t total = 0;
  for (size_t size : sizes)
    if (size > 0) total += align_workspace(size);
  return total;
}

void* WorkspaceArena::take(size_t bytes) {
  const size_t aligned = align_workspace(bytes);
  if (aligned > bytes_ - used_) {
    shortfall_ += aligned;
    total_shortfall += aligned;
    return nullptr;
  }
  void* block = data_ + used_;
  used_ += aligned;
  return block;
}

WorkspaceArena* WorkspaceArena::current() { return current_arena; }

WorkspaceScope::WorkspaceScope(WorkspaceArena* arena) : previous_(current_arena) {
  current_arena = arena;
}

WorkspaceScope::~WorkspaceScope() { current_arena = previous_; }

uint64_t workspace_shortfall_bytes() { return total_shortfall.load(); }

}  // namespace dpa
