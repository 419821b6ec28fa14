// Outputs that share memory with the call's inputs or with each other (DESIGN.md §7). A backend
// reads its inputs while it writes its outputs, in tiles and on many threads or blocks, so an
// element that an output shares with an input is read after it was overwritten, and one that
// two outputs (or two elements of one output) share is written twice: wrong results, silently.
//
// From the views alone this is decidable only in part (interleaved strided views, such as the
// q, k and v slices of one packed [b, s, 3, H, d] tensor, share a byte range without sharing an
// element). The checks refuse what they can prove and leave the rest to the caller's contract
// (docs/hardening.md, "Outputs apart from inputs").
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "dpa/arguments.h"
#include "dpa/tensor.h"

namespace dpa {

// The bytes a strided view spans, [begin, end); empty when it has no element or no data.
struct ByteRange {
  uintptr_t begin = 0, end = 0;
  bool empty() const { return begin >= end; }
  bool intersects(const ByteRange& other) const {
    return !empty() && !other.empty() && begin < other.end && other.begin < end;
  }
};
ByteRange byte_range(const TensorView& t);

// Whether the view's elements fill its byte range with no gap and no repeat (row-major or any
// other order of its dimensions).
bool is_dense(const TensorView& t);

// Whether a and b provably share memory: both dense with intersecting byte ranges, or the same
// first element. Views on different devices never do.
bool provably_share_memory(const TensorView& a, const TensorView& b);

// Throws kInvalidArgument naming `name` when two of the output's elements are one (a stride of
// 0 across an extent above 1, as an expanded view has).
void require_no_repeated_elements(const TensorView& out, const char* name);

// Throws kInvalidArgument naming `out_name` when provably_share_memory(out, other).
void require_apart(const TensorView& out, const char* out_name, const TensorView& other,
                   const char* other_name);

// A view and its argument name.
using NamedView = std::pair<const TensorView*, const char*>;

// Throws kInvalidArgument naming "workspace" when the caller's block (data and bytes; an
// allocator's memory is not known yet) meets the bytes of any of `views`: the call may write
// all of the block.
void require_workspace_apart(const Workspace& workspace, std::span<const NamedView> views);

// Every output of a forward call (o, lse) apart from every input and from each other; of a
// backward call (dq, dk, dv, dbias, dsoftmax_offset) apart from every input, o, lse and d_o,
// and from each other; the caller's workspace block apart from all of them.
void require_forward_outputs_apart(const ForwardArgs& args);
void require_backward_outputs_apart(const BackwardArgs& args);

}  // namespace dpa
