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
  // Checks that `dir` is a directory or can be one, without creating it.
  static void check_directory(const std::string& dir);
  // Creates `dir` (and parents) and writes every file. On failure removes the files it wrote
  // and throws dpa::Error(kIo).
  void write_all(const std::string& dir) const;
  std::vector<std::string> names() const;

 private:
  std::vector<std::pair<std::string, std::string>> files_;  // name, encoded bytes
};

}  // namespace dpa::cli
