#include "cli_output.h"

#include <filesystem>
#include <system_error>

#include "dpa/error.h"

namespace dpa::cli {

namespace fs = std::filesystem;

void OutputFiles::add(const std::string& file_name, const npy::Array& array) {
  files_.emplace_back(file_name, npy::encode(array));
}

void OutputFiles::check_directory(const std::string& dir) {
  std::error_code error;
  fs::path path(dir);
  // The nearest existing ancestor must be a directory; the path itself, if it exists, too.
  while (!path.empty() && !fs::exists(path, error)) path = path.parent_path();
  if (!path.empty() && !fs::is_directory(path, error)) {
    throw Error(ErrorCode::kIo, "out",
                "'" + dir + "': '" + path.string() + "' exists and is not a directory");
  }
}

void OutputFiles::write_all(const std::string& dir) const {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    throw Error(ErrorCode::kIo, "", "cannot create directory '" + dir + "': " + error.message());
  }
  std::vector<fs::path> written;
  try {
    for (const auto& [name, bytes] : files_) {
      fs::path path = fs::path(dir) / name;
      written.push_back(path);  // before writing: a half-written file is removed too
      npy::write_file(path.string(), bytes);
    }
  } catch (...) {
    for (const fs::path& path : written) fs::remove(path, error);
    throw;
  }
}

std::vector<std::string> OutputFiles::names() const {
  std::vector<std::string> names;
  for (const auto& file : files_) names.push_back(file.first);
  return names;
}

}  // namespace dpa::cli
