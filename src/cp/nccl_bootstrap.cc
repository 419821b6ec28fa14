// NCCL bootstrap helpers that need neither CUDA nor NCCL (built and tested everywhere):
// launcher environment parsing, the unique-id file, the environment recipe. Without NCCL the
// factories below are stubs that throw kNotSupported.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "dpa/error.h"
#include "dpa/nccl.h"

namespace dpa {

namespace {

// A strict decimal integer in [lo, hi]: no sign unless negative values are allowed, no spaces,
// no trailing characters.
std::optional<long long> parse_integer(const char* text, long long lo, long long hi) {
  if (text == nullptr || *text == '\0') return std::nullopt;
  const char* p = text;
  bool negative = false;
  if (*p == '-') {
    negative = true;
    ++p;
  }
  if (*p == '\0') return std::nullopt;
  long long value = 0;
  for (; *p; ++p) {
    if (*p < '0' || *p > '9') return std::nullopt;
    value = value * 10 + (*p - '0');
    if (value > hi + 1) return std::nullopt;  // also keeps the sum far from overflow
  }
  if (negative) value = -value;
  if (value < lo || value > hi) return std::nullopt;
  return value;
}

long long env_int(const GetEnv& getenv, const char* name, long long lo, long long hi) {
  const char* text = getenv(name);
  const std::optional<long long> value = parse_integer(text, lo, hi);
  require(value.has_value(), name, [&] {
    return "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" +
           std::string(text ? text : "") + "'";
  });
  return *value;
}

struct LauncherVariables {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
};

constexpr LauncherVariables kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

constexpr const char* kIdFileMagic = "dpa-nccl-id 1";
constexpr int kMaxRanks = 1 << 20;

std::string to_hex(const std::vector<uint8_t>& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    hex.push_back(digits[b >> 4]);
    hex.push_back(digits[b & 15]);
  }
  return hex;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The parsed id file, or why it is not one.
struct IdFileContents {
  bool valid = false;
  std::string key;
  std::vector<uint8_t> id;
  std::string problem;
};

IdFileContents parse_id_file(const std::string& text) {
  IdFileContents out;
  std::istringstream lines(text);
  std::string magic, key_line, hex;
  if (!std::getline(lines, magic) || magic != kIdFileMagic) {
    out.problem = "no '" + std::string(kIdFileMagic) + "' header";
    return out;
  }
  if (!std::getline(lines, key_line) || key_line.rfind("key ", 0) != 0) {
    out.problem = "no key line";
    return out;
  }
  if (!std::getline(lines, hex) || hex.size() != 2 * kNcclUniqueIdBytes) {
    out.problem = "no id line of " + std::to_string(2 * kNcclUniqueIdBytes) + " hex digits";
    return out;
  }
  out.id.resize(kNcclUniqueIdBytes);
  for (size_t i = 0; i < kNcclUniqueIdBytes; ++i) {
    const int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      out.problem = "a non-hex character in the id";
      return out;
    }
    out.id[i] = uint8_t(hi * 16 + lo);
  }
  out.key = key_line.substr(4);
  out.valid = true;
  return out;
}

Error io_error(const std::string& path, const std::string& what) {
  return Error(ErrorCode::kIo, "id_file",
               what + " '" + path + "': " + std::string(std::strerror(errno)));
}

}  // namespace

bool nccl_built() {
#ifdef DPA_WITH_NCCL
  return true;
#else
  return false;
#endif
}

std::optional<LaunchEnv> launch_env_from(const GetEnv& getenv) {
  for (const LauncherVariables& vars : kLaunchers) {
    if (getenv(vars.rank) == nullptr) continue;
    require(getenv(vars.size) != nullptr, vars.size, [&] {
      return std::string("must be set along with ") + vars.rank + " (" + vars.launcher + ")";
    });
    LaunchEnv env;
    env.launcher = vars.launcher;
    env.size = int(env_int(getenv, vars.size, 1, kMaxRanks));
    env.rank = int(env_int(getenv, vars.rank, 0, env.size - 1));
    if (getenv(vars.local_rank) != nullptr)
      env.local_rank = int(env_int(getenv, vars.local_rank, 0, env.size - 1));
    else
      env.local_rank = env.size == 1 ? 0 : -1;
    return env;
  }
  return std::nullopt;
}

std::optional<LaunchEnv> launch_env() {
  return launch_env_from([](const char* name) -> const char* { return std::getenv(name); });
}

void write_nccl_id_file(const std::string& path, const std::vector<uint8_t>& id,
                        const std::string& key) {
  require(id.size() == kNcclUniqueIdBytes, "id", [&] {
    return "must hold " + std::to_string(kNcclUniqueIdBytes) + " bytes, got " +
           std::to_string(id.size());
  });
  require(key.find('\n') == std::string::npos && key.find('\r') == std::string::npos, "key",
          "must be one line");
  require(!path.empty(), "id_file", "must not be empty");
  static std::atomic<unsigned> counter{0};
  const std::string temp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  const std::string text = std::string(kIdFileMagic) + "\nkey " + key + "\n" + to_hex(id) + "\n";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw io_error(temp, "cannot create");
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Error error = io_error(temp, "cannot write");
      ::close(fd);
      ::unlink(temp.c_str());
      throw error;
    }
    written += size_t(n);
  }
  // fsync before rename: on a shared file system a reader on another node must never see the
  // new name before the bytes.
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    Error error = io_error(temp, "cannot flush");
    ::unlink(temp.c_str());
    throw error;
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    Error error = io_error(path, "cannot rename " + temp + " to");
    ::unlink(temp.c_str());
    throw error;
  }
}

std::vector<uint8_t> read_nccl_id_file(const std::string& path, std::chrono::milliseconds timeout,
                                       const std::string& key) {
  require(!path.empty(), "id_file", "must not be empty");
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  // Short polls first (ranks usually start together), then at most every 50 ms.
  auto pause = std::chrono::milliseconds(2);
  std::string found = "no file";
  for (;;) {
    std::ifstream file(path, std::ios::binary);
    if (file) {
      std::ostringstream text;
      text << file.rdbuf();
      const IdFileContents contents = parse_id_file(text.str());
      if (!contents.valid)
        found = "a file that is not an id file (" + contents.problem + ")";
      else if (contents.key != key)
        found = "an id with key '" + contents.key + "' (stale, from another job?)";
      else
        return contents.id;
    }
    if (Clock::now() >= deadline)
      throw Error(ErrorCode::kBackendFailure, "communicator",
                  "timed out after " + std::to_string(timeout.count()) +
                      " ms waiting for the NCCL id in '" + path + "' (key '" + key + "'); found " +
                      found + ". Is rank 0 running, and writing the same path?");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

NcclBootstrap NcclBootstrap::from_id(std::vector<uint8_t> id) {
  NcclBootstrap bootstrap;
  bootstrap.unique_id = std::move(id);
  return bootstrap;
}

NcclBootstrap NcclBootstrap::from_file(std::string path, std::string key) {
  NcclBootstrap bootstrap;
  bootstrap.id_file = std::move(path);
  bootstrap.id_key = std::move(key);
  return bootstrap;
}

NcclEnvConfig nccl_env_config_from(const GetEnv& getenv,
                                   std::chrono::milliseconds default_timeout) {
  NcclEnvConfig config;
  std::optional<LaunchEnv> launch = launch_env_from(getenv);
  require(launch.has_value(), "RANK",
          "no launcher environment: set RANK, WORLD_SIZE and LOCAL_RANK (torchrun), or run "
          "under OpenMPI mpirun or Slurm srun");
  config.launch = *launch;

  const char* id_file = getenv("DPA_NCCL_ID_FILE");
  require(id_file != nullptr && *id_file != '\0', "DPA_NCCL_ID_FILE",
          "must name the file through which rank 0 hands out the NCCL id (fresh for each job, "
          "on a file system every rank sees)");
  // The default key names this attempt of this job: a restarted torchrun attempt (same run
  // id) or a later Slurm step must not take the id file a dead attempt left behind.
  std::string key;
  if (const char* k = getenv("DPA_NCCL_ID_KEY")) {
    key = k;
  } else if (const char* run_id = getenv("TORCHELASTIC_RUN_ID")) {
    key = run_id;
    if (const char* restart = getenv("TORCHELASTIC_RESTART_COUNT")) {
      key += '/';  // appended piecewise: GCC 12 misreports "/" + string (-Wrestrict)
      key += restart;
    }
  } else if (const char* job = getenv("SLURM_JOB_ID")) {
    key = job;
    if (const char* step = getenv("SLURM_STEP_ID")) {
      key += '/';
      key += step;
    }
  }
  config.bootstrap = NcclBootstrap::from_file(id_file, key);

  if (getenv("DPA_NCCL_DEVICE") != nullptr) {
    config.device = int(env_int(getenv, "DPA_NCCL_DEVICE", 0, 1 << 16));
  } else {
    require(config.launch.local_rank >= 0, "DPA_NCCL_DEVICE", [&] {
      return "must be set: the launcher (" + config.launch.launcher +
             ") gave no local rank to choose the CUDA device from";
    });
    config.device = config.launch.local_rank;
  }

  config.timeout = default_timeout;
  if (getenv("DPA_NCCL_TIMEOUT_MS") != nullptr)
    config.timeout =
        std::chrono::milliseconds(env_int(getenv, "DPA_NCCL_TIMEOUT_MS", 1, 1LL << 40));
  require(config.timeout.count() > 0, "timeout", "must be positive");
  return config;
}

std::unique_ptr<NcclCommunicator> make_nccl_communicator_from_env(
    std::chrono::milliseconds default_timeout, void* stream) {
  const NcclEnvConfig config = nccl_env_config_from(
      [](const char* name) -> const char* { return std::getenv(name); }, default_timeout);
  return make_nccl_communicator(config.launch.rank, config.launch.size, config.device,
                                config.bootstrap, config.timeout, stream);
}

#ifndef DPA_WITH_NCCL

namespace {
Error built_without_nccl() {
  return Error(ErrorCode::kNotSupported, "communicator",
               "dpa was built without NCCL (configure with -DDPA_NCCL=ON, CUDA and NCCL "
               "installed)");
}
}  // namespace

std::vector<uint8_t> nccl_unique_id() { throw built_without_nccl(); }

std::unique_ptr<NcclCommunicator> make_nccl_communicator(int, int, int, const NcclBootstrap&,
                                                         std::chrono::milliseconds, void*) {
  throw built_without_nccl();
}

#endif

}  // namespace dpa
