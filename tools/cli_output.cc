#include "cli_output.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "dpa/error.h"

namespace dpa::cli {

namespace fs = std::filesystem;

void OutputFiles::add(const std::string& file_name, const npy::Array& array) {
  files_.emplace_back(file_name, npy::encode(array));
}

void OutputFiles::check_directory(const std::string& dir,
                                  const std::vector<std::string>& file_names) {
  std::error_code error;
  fs::path path(dir);
  // The nearest existing ancestor must be a writable directory; the path itself, if it
  // exists, too. Checked before any compute, so that a run cannot end unable to write.
  while (!path.empty() && !fs::exists(path, error)) path = path.parent_path();
  if (path.empty()) path = ".";
  if (!fs::is_directory(path, error)) {
    throw Error(ErrorCode::kIo, "out",
                "'" + dir + "': '" + path.string() + "' exists and is not a directory");
  }
  if (::access(path.c_str(), W_OK | X_OK) != 0) {
    throw Error(
        ErrorCode::kIo, "out",
        "'" + dir + "': cannot write into '" + path.string() + "': " + std::strerror(errno));
  }
  // An output name taken by something that is not a regular file (a directory, say) would
  // make the final rename fail after the others replaced their files.
  for (const std::string& name : file_names) {
    const fs::path target = fs::path(dir) / name;
    if (fs::exists(target, error) && !fs::is_regular_file(target, error))
      throw Error(ErrorCode::kIo, "out",
                  "'" + target.string() + "' exists and is not a regular file");
  }
}

void OutputFiles::write_all(const std::string& dir) const {
  std::error_code error;
  // The directories this call creates, outermost first: only those are removed on failure.
  std::vector<fs::path> created;
  for (fs::path path = fs::path(dir); !path.empty() && !fs::exists(path, error);
       path = path.parent_path())
    created.insert(created.begin(), path);
  fs::create_directories(dir, error);
  if (error) {
    throw Error(ErrorCode::kIo, "out", "cannot create directory '" + dir + "': " + error.message());
  }
  // Every file goes to a temporary name first and is renamed into place once all are written,
  // so a failure (a full disk, say) leaves the user's existing files untouched and removes
  // only what this call created.
  std::vector<std::pair<fs::path, fs::path>> staged;  // temporary, final
  try {
    for (const auto& [name, bytes] : files_) {
      const fs::path final_path = fs::path(dir) / name;
      const fs::path temporary =
          fs::path(dir) / ("." + name + ".tmp-" + std::to_string(::getpid()));
      staged.emplace_back(temporary, final_path);  // before writing: a partial file goes too
      npy::write_file(temporary.string(), bytes);
    }
    for (const auto& [temporary, final_path] : staged) {
      fs::rename(temporary, final_path, error);
      if (error)
        throw Error(ErrorCode::kIo, "out",
                    "cannot move '" + temporary.string() + "' to '" + final_path.string() +
                        "': " + error.message());
    }
  } catch (...) {
    for (const auto& staged_file : staged) fs::remove(staged_file.first, error);
    for (auto it = created.rbegin(); it != created.rend(); ++it) fs::remove(*it, error);
    throw;
  }
}

std::vector<std::string> OutputFiles::names() const {
  std::vector<std::string> names;
  for (const auto& file : files_) names.push_back(file.first);
  return names;
}

}  // namespace dpa::cli
