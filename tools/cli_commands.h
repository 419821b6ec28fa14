// The dpa tool's subcommands. Each takes the words after its name and returns the exit status;
// none throws.
#pragma once

#include <string>
#include <vector>

namespace dpa::cli {

int attention_command(const std::vector<std::string>& words);
int explain_command(const std::vector<std::string>& words);
int run_command(const std::vector<std::string>& words);
int cp_check_command(const std::vector<std::string>& words);
int bench_command(const std::vector<std::string>& words);  // CUDA builds only

}  // namespace dpa::cli
