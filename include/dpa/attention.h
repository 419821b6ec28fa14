// DotProductAttention: the public entry point (forward, backward, explain).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dpa/arguments.h"
#include "dpa/config.h"
#include "dpa/error.h"
#include "dpa/selection.h"
#include "dpa/tensor.h"

namespace dpa {

class DotProductAttention {
 public:
  explicit DotProductAttention(const AttentionConfig& config);

  const AttentionConfig& config() const { return config_; }

  // Validates everything, selects a backend and runs it. Throws dpa::Error; on error no
  // output has been written.
  ForwardResult forward(const ForwardArgs& args);
  BackendKind backward(const BackwardArgs& args);

  // The workspace bytes a call with these arguments needs (validates and selects as the call
  // would; the workspace field itself is ignored). 0 for host tensors.
  size_t workspace_size(const ForwardArgs& args) const;
  size_t workspace_size(const BackwardArgs& args) const;

  // The selection a call with these inputs would make, with every backend's reasons.
  // Shapes are validated; tensor contents are not read (data pointers may be null).
  Selection explain(const AttentionInputs& in, Pass pass, bool wants_dbias = false,
                    bool wants_dsoftmax_offset = false) const;

 private:
  AttentionConfig config_;
  uint64_t next_offset_ = 0;
};

}  // namespace dpa
