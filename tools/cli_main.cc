// The dpa command-line tool: dispatches to a subcommand.
#include <iostream>
#include <string>
#include <vector>

#include "cli_commands.h"
#include "cli_errors.h"

namespace {

constexpr const char* kUsage =
    "usage: dpa <command> [flags]\n"
    "\n"
    "commands:\n"
    "  run        demo: Gemma-2-like (softcap, sliding window, GQA) and gpt-oss-like (sinks,\n"
    "             window) layers, forward + backward on the best backend, timed and checked\n"
    "             against cpu_exact\n"
    "  attention  one forward (and backward with --do) call on .npy inputs; writes .npy outputs\n"
    "  explain    which backend a call would use, and every backend's reasons\n"
    "  cp-check   context parallelism with in-process ranks vs the unsharded cpu_exact call\n"
    "  bench      time forward/backward on CUDA device tensors: median ms, TFLOP/s, GB/s\n"
    "\n"
    "`dpa <command> --help` lists a command's flags. Environment: DPA_BACKEND=name forces a\n"
    "backend, DPA_LOG=info|debug logs the selection (both read by the library).\n"
    "Exit status: 0 success, 2 bad flags or invalid input, 1 other failures.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return dpa::cli::kExitUsage;
  }
  const std::string command = argv[1];
  const std::vector<std::string> words(argv + 2, argv + argc);
  if (command == "-h" || command == "--help" || command == "help") {
    std::cout << kUsage;
    return dpa::cli::kExitOk;
  }
  if (command == "attention") return dpa::cli::attention_command(words);
  if (command == "explain") return dpa::cli::explain_command(words);
  if (command == "run") return dpa::cli::run_command(words);
  if (command == "cp-check") return dpa::cli::cp_check_command(words);
  if (command == "bench") return dpa::cli::bench_command(words);
  std::cerr << "dpa: error: unknown command '" << command << "' (run, attention, explain, bench)\n";
  return dpa::cli::kExitUsage;
}
