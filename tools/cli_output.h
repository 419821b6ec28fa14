// Writing a command's output files all at once, only after everything was computed, so that a
// failed run leaves no file behind (the CLI contract: bad input writes nothing into --out).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "npy.h"

namespace dpa::cli {

class OutputFiles {
 public:
  // Encodes now (so encoding errors happen before anything touches the disk).
  void add(const std::string& file_name, const npy::Array& array);
  // Checks, without creating anything, that `dir` is a writable directory or can be made one,
  // and that none of `file_names` in it is taken by something other than a regular file.
  static void check_directory(const std::string& dir,
                              const std::vector<std::string>& file_names = {});
  // Creates `dir` (and parents) and writes every file under a temporary name, then renames them
  // into place. On failure removes only what it created (temporaries, new directories) and
  // throws dpa::Error(kIo) naming "out".
  void write_all(const std::string& dir) const;
  std::vector<std::string> names() const;

 private:
  std::vector<std::pair<std::string, std::string>> files_;  // name, encoded bytes
};

}  // namespace dpa::cli
