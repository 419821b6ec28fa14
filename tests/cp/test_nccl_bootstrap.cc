// NCCL bootstrap helpers that need no GPU (include/dpa/nccl.h): launcher environment parsing,
// the environment recipe, the unique-id file between threads and between processes, and the
// factories' argument checks. The NCCL operations themselves are tested by tests/nccl.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "dpa/error.h"
#include "dpa/nccl.h"

namespace dpa {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Env = std::map<std::string, std::string>;

GetEnv from(const Env& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

// Runs `fn` and returns the dpa::Error it throws (fails the test when it throws none).
template <typename Fn>
Error error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& error) {
    return error;
  }
  ADD_FAILURE() << "no dpa::Error thrown";
  return Error(ErrorCode::kInternal, "", "none thrown");
}

std::vector<uint8_t> sample_id(uint8_t salt) {
  std::vector<uint8_t> id(kNcclUniqueIdBytes);
  for (size_t i = 0; i < id.size(); ++i) id[i] = uint8_t(i * 37 + salt);
  return id;
}

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/dpa_nccl_test.XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    const char* made = ::mkdtemp(buffer.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = made;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  size_t entries() const {
    size_t n = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(path_)) ++n;
    return n;
  }

 private:
  std::string path_;
};

// ---- Launcher environment ----

TEST(NcclLaunchEnv, Torchrun) {
  const Env env = {{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}};
  const std::optional<LaunchEnv> launch = launch_env_from(from(env));
  ASSERT_TRUE(launch.has_value());
  EXPECT_EQ(launch->rank, 3);
  EXPECT_EQ(launch->size, 8);
  EXPECT_EQ(launch->local_rank, 1);
  EXPECT_EQ(launch->launcher, "torchrun");
}

TEST(NcclLaunchEnv, OpenMpi) {
  const Env env = {{"OMPI_COMM_WORLD_RANK", "5"},
                   {"OMPI_COMM_WORLD_SIZE", "6"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}};
  const std::optional<LaunchEnv> launch = launch_env_from(from(env));
  ASSERT_TRUE(launch.has_value());
  EXPECT_EQ(launch->rank, 5);
  EXPECT_EQ(launch->size, 6);
  EXPECT_EQ(launch->local_rank, 2);
  EXPECT_EQ(launch->launcher, "openmpi");
}

TEST(NcclLaunchEnv, Slurm) {
  const Env env = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}};
  const std::optional<LaunchEnv> launch = launch_env_from(from(env));
  ASSERT_TRUE(launch.has_value());
  EXPECT_EQ(launch->launcher, "slurm");
  EXPECT_EQ(launch->size, 2);
}

TEST(NcclLaunchEnv, TorchrunWinsOverTheOuterLauncher) {
  // torchrun inside an srun or mpirun allocation: the workers' own variables count.
  const Env env = {{"RANK", "1"},
                   {"WORLD_SIZE", "4"},
                   {"LOCAL_RANK", "1"},
                   {"SLURM_PROCID", "0"},
                   {"SLURM_NTASKS", "1"},
                   {"SLURM_LOCALID", "0"},
                   {"OMPI_COMM_WORLD_RANK", "0"},
                   {"OMPI_COMM_WORLD_SIZE", "1"}};
  const std::optional<LaunchEnv> launch = launch_env_from(from(env));
  ASSERT_TRUE(launch.has_value());
  EXPECT_EQ(launch->launcher, "torchrun");
  EXPECT_EQ(launch->rank, 1);
  EXPECT_EQ(launch->size, 4);
}

TEST(NcclLaunchEnv, NoneIsNullopt) {
  const Env env = {{"WORLD_SIZE", "4"}, {"HOME", "/root"}};  // no rank variable of any set
  EXPECT_FALSE(launch_env_from(from(env)).has_value());
}

TEST(NcclLaunchEnv, MissingLocalRank) {
  EXPECT_EQ(launch_env_from(from({{"RANK", "1"}, {"WORLD_SIZE", "2"}}))->local_rank, -1);
  EXPECT_EQ(launch_env_from(from({{"RANK", "0"}, {"WORLD_SIZE", "1"}}))->local_rank, 0);
}

TEST(NcclLaunchEnv, PartialOrMalformedNamesTheVariable) {
  struct Case {
    Env env;
    const char* argument;
  };
  const std::vector<Case> cases = {
      {{{"RANK", "0"}}, "WORLD_SIZE"},
      {{{"RANK", "1x"}, {"WORLD_SIZE", "4"}}, "RANK"},
      {{{"RANK", " 1"}, {"WORLD_SIZE", "4"}}, "RANK"},
      {{{"RANK", ""}, {"WORLD_SIZE", "4"}}, "RANK"},
      {{{"RANK", "-1"}, {"WORLD_SIZE", "4"}}, "RANK"},
      {{{"RANK", "4"}, {"WORLD_SIZE", "4"}}, "RANK"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "99999999999999999999"}}, "WORLD_SIZE"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "two"}}, "LOCAL_RANK"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}}, "OMPI_COMM_WORLD_SIZE"},
  };
  for (const Case& c : cases) {
    const Error error = error_of([&] { launch_env_from(from(c.env)); });
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    EXPECT_EQ(error.argument(), c.argument) << error.what();
  }
}

// ---- The environment recipe ----

TEST(NcclEnvConfig, Defaults) {
  const Env env = {{"RANK", "2"},
                   {"WORLD_SIZE", "4"},
                   {"LOCAL_RANK", "2"},
                   {"TORCHELASTIC_RUN_ID", "job42"},
                   {"DPA_NCCL_ID_FILE", "/shared/id"}};
  const NcclEnvConfig config = nccl_env_config_from(from(env), 1234ms);
  EXPECT_EQ(config.launch.rank, 2);
  EXPECT_EQ(config.launch.size, 4);
  EXPECT_EQ(config.device, 2);
  EXPECT_EQ(config.bootstrap.id_file, "/shared/id");
  EXPECT_EQ(config.bootstrap.id_key, "job42");
  EXPECT_TRUE(config.bootstrap.unique_id.empty());
  EXPECT_EQ(config.timeout, 1234ms);
}

// A restarted torchrun attempt keeps its run id: the key must tell the attempts apart, so that
// a new attempt never reads the id file a failed one left behind. Slurm: job and step.
TEST(NcclEnvConfig, DefaultKeyNamesTheAttempt) {
  const Env torchrun = {{"RANK", "0"},
                        {"WORLD_SIZE", "2"},
                        {"LOCAL_RANK", "0"},
                        {"TORCHELASTIC_RUN_ID", "job42"},
                        {"TORCHELASTIC_RESTART_COUNT", "3"},
                        {"DPA_NCCL_ID_FILE", "/shared/id"}};
  EXPECT_EQ(nccl_env_config_from(from(torchrun), 1000ms).bootstrap.id_key, "job42/3");
  const Env slurm = {{"SLURM_PROCID", "1"},  {"SLURM_NTASKS", "2"},
                     {"SLURM_LOCALID", "1"}, {"SLURM_JOB_ID", "777"},
                     {"SLURM_STEP_ID", "2"}, {"DPA_NCCL_ID_FILE", "/shared/id"}};
  EXPECT_EQ(nccl_env_config_from(from(slurm), 1000ms).bootstrap.id_key, "777/2");
}

TEST(NcclEnvConfig, Overrides) {
  const Env env = {{"OMPI_COMM_WORLD_RANK", "1"},      {"OMPI_COMM_WORLD_SIZE", "2"},
                   {"TORCHELASTIC_RUN_ID", "job42"},   {"DPA_NCCL_ID_KEY", ""},
                   {"DPA_NCCL_ID_FILE", "/shared/id"}, {"DPA_NCCL_DEVICE", "3"},
                   {"DPA_NCCL_TIMEOUT_MS", "2500"}};
  const NcclEnvConfig config = nccl_env_config_from(from(env), 1234ms);
  EXPECT_EQ(config.launch.launcher, "openmpi");
  EXPECT_EQ(config.device, 3);             // no local rank given: DPA_NCCL_DEVICE decides
  EXPECT_EQ(config.bootstrap.id_key, "");  // set, even empty, it wins over the run id
  EXPECT_EQ(config.timeout, 2500ms);
}

TEST(NcclEnvConfig, MissingOrMalformedNamesTheVariable) {
  const Env base = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}};
  auto with = [&](Env extra) {
    Env env = base;
    for (auto& [k, v] : extra) env[k] = v;
    return env;
  };
  struct Case {
    Env env;
    const char* argument;
  };
  const std::vector<Case> cases = {
      {{{"DPA_NCCL_ID_FILE", "/x"}}, "RANK"},  // no launcher at all
      {base, "DPA_NCCL_ID_FILE"},
      {with({{"DPA_NCCL_ID_FILE", ""}}), "DPA_NCCL_ID_FILE"},
      {with({{"DPA_NCCL_ID_FILE", "/x"}, {"DPA_NCCL_DEVICE", "gpu0"}}), "DPA_NCCL_DEVICE"},
      {with({{"DPA_NCCL_ID_FILE", "/x"}, {"DPA_NCCL_TIMEOUT_MS", "0"}}), "DPA_NCCL_TIMEOUT_MS"},
      {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"DPA_NCCL_ID_FILE", "/x"}}, "DPA_NCCL_DEVICE"},
  };
  for (const Case& c : cases) {
    const Error error = error_of([&] { nccl_env_config_from(from(c.env), 1000ms); });
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    EXPECT_EQ(error.argument(), c.argument) << error.what();
  }
}

// ---- The id file ----

TEST(NcclIdFile, RoundTripLeavesNoTemporaryFile) {
  TempDir dir;
  const std::string path = dir.file("id");
  write_nccl_id_file(path, sample_id(1), "job");
  EXPECT_EQ(read_nccl_id_file(path, 1000ms, "job"), sample_id(1));
  write_nccl_id_file(path, sample_id(2), "job");  // replaces atomically
  EXPECT_EQ(read_nccl_id_file(path, 1000ms, "job"), sample_id(2));
  EXPECT_EQ(dir.entries(), 1u);
}

TEST(NcclIdFile, ReaderWaitsForAWriterThread) {
  TempDir dir;
  const std::string path = dir.file("id");
  const auto start = Clock::now();
  std::thread writer([&] {
    std::this_thread::sleep_for(200ms);
    write_nccl_id_file(path, sample_id(3), "k");
  });
  const std::vector<uint8_t> id = read_nccl_id_file(path, 10000ms, "k");
  writer.join();
  EXPECT_EQ(id, sample_id(3));
  EXPECT_GE(Clock::now() - start, 150ms);
}

TEST(NcclIdFile, ReaderWaitsForAWriterProcess) {
  TempDir dir;
  const std::string path = dir.file("id");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child only sleeps, writes and leaves: no gtest, no exit handlers.
    std::this_thread::sleep_for(100ms);
    try {
      write_nccl_id_file(path, sample_id(4), "proc");
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  std::vector<uint8_t> id;
  EXPECT_NO_THROW(id = read_nccl_id_file(path, 10000ms, "proc"));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(id, sample_id(4));
}

TEST(NcclIdFile, StaleKeyIsIgnoredUntilTheRightOneArrives) {
  TempDir dir;
  const std::string path = dir.file("id");
  write_nccl_id_file(path, sample_id(5), "old-job");
  const Error error = error_of([&] { read_nccl_id_file(path, 100ms, "new-job"); });
  EXPECT_EQ(error.code(), ErrorCode::kBackendFailure);
  EXPECT_NE(std::string(error.what()).find("old-job"), std::string::npos) << error.what();
  EXPECT_NE(std::string(error.what()).find("stale"), std::string::npos) << error.what();

  std::thread writer([&] {
    std::this_thread::sleep_for(100ms);
    write_nccl_id_file(path, sample_id(6), "new-job");
  });
  const std::vector<uint8_t> id = read_nccl_id_file(path, 10000ms, "new-job");
  writer.join();
  EXPECT_EQ(id, sample_id(6));
}

TEST(NcclIdFile, TimeoutIsBoundedAndSaysWhatItFound) {
  TempDir dir;
  const std::string missing = dir.file("missing");
  auto start = Clock::now();
  Error error = error_of([&] { read_nccl_id_file(missing, 300ms); });
  const auto elapsed = Clock::now() - start;
  EXPECT_EQ(error.code(), ErrorCode::kBackendFailure);
  EXPECT_EQ(error.argument(), "communicator");
  EXPECT_GE(elapsed, 300ms);
  EXPECT_LT(elapsed, 3000ms);
  EXPECT_NE(std::string(error.what()).find("no file"), std::string::npos) << error.what();

  const std::string garbage = dir.file("garbage");
  { std::ofstream(garbage) << "not an id\n"; }
  error = error_of([&] { read_nccl_id_file(garbage, 50ms); });
  EXPECT_NE(std::string(error.what()).find("not an id file"), std::string::npos) << error.what();
}

TEST(NcclIdFile, WriteChecksItsArguments) {
  TempDir dir;
  EXPECT_EQ(error_of([&] { write_nccl_id_file(dir.file("id"), {1, 2, 3}); }).argument(), "id");
  EXPECT_EQ(error_of([&] { write_nccl_id_file(dir.file("id"), sample_id(0), "a\nb"); }).argument(),
            "key");
  const Error io = error_of([&] { write_nccl_id_file(dir.file("no/such/dir/id"), sample_id(0)); });
  EXPECT_EQ(io.code(), ErrorCode::kIo);
  EXPECT_EQ(dir.entries(), 0u);
}

// ---- Factories ----

TEST(NcclFactory, ChecksArgumentsOrSaysNcclIsMissing) {
  const NcclBootstrap by_id = NcclBootstrap::from_id(sample_id(7));
  if (!nccl_built()) {
    EXPECT_EQ(error_of([&] { make_nccl_communicator(0, 1, 0, by_id); }).code(),
              ErrorCode::kNotSupported);
    EXPECT_EQ(error_of([] { nccl_unique_id(); }).code(), ErrorCode::kNotSupported);
    return;
  }
  // Argument checks come before any CUDA or NCCL call, so they run without a GPU.
  EXPECT_EQ(error_of([&] { make_nccl_communicator(2, 2, 0, by_id); }).argument(), "rank");
  EXPECT_EQ(error_of([&] { make_nccl_communicator(0, 0, 0, by_id); }).argument(), "size");
  EXPECT_EQ(error_of([&] { make_nccl_communicator(0, 1, 0, by_id, 0ms); }).argument(), "timeout");
  NcclBootstrap both = by_id;
  both.id_file = "/tmp/x";
  EXPECT_EQ(error_of([&] { make_nccl_communicator(0, 1, 0, both); }).argument(), "bootstrap");
  EXPECT_EQ(error_of([&] { make_nccl_communicator(0, 1, 0, NcclBootstrap{}); }).argument(),
            "bootstrap");
  EXPECT_EQ(error_of([&] {
              make_nccl_communicator(0, 1, 0, NcclBootstrap::from_id({1, 2}));
            }).argument(),
            "bootstrap");
}

}  // namespace
}  // namespace dpa
