// Command-line parsing for the dpa tool: flags of the form `--name value`, `--name=value` and
// boolean `--switch`. No third-party parser; every mistake is a UsageError naming the flag.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dpa::cli {

// A command-line mistake (unknown flag, missing value, unparsable number, ...). `flag` is the
// flag's name without dashes ("softcap"), or empty when no flag is involved. Exit status 2.
class UsageError : public std::runtime_error {
 public:
  UsageError(std::string flag, const std::string& message)
      : std::runtime_error(message), flag_(std::move(flag)) {}
  const std::string& flag() const { return flag_; }

 private:
  std::string flag_;
};

struct FlagSpec {
  std::string name;        // without dashes: "softcap" is given as --softcap
  std::string value_name;  // shown in the help ("C"); empty for a boolean switch
  std::string help;
};

class ParsedArgs {
 public:
  bool help_requested() const { return help_requested_; }
  bool has(std::string_view name) const { return values_.count(std::string(name)) > 0; }
  std::optional<std::string> get(std::string_view name) const;
  std::string get_or(std::string_view name, std::string_view fallback) const;
  // The value of a flag that must be present; UsageError "--name is required" otherwise.
  std::string require(std::string_view name) const;

  std::optional<double> get_double(std::string_view name) const;
  std::optional<int64_t> get_int(std::string_view name) const;
  std::optional<uint64_t> get_uint64(std::string_view name) const;
  // A comma-separated list of integers ("2,1024,8,64"); `count` > 0 demands that many.
  std::optional<std::vector<int64_t>> get_int_list(std::string_view name, int count = 0) const;
  // A flag whose value is a name that `parse` (a parse_* of dpa/types.h) turns into an
  // enumerator: nullopt where the flag is absent; a name `parse` does not know is a UsageError
  // "--NAME: unknown KIND 'VALUE' (CHOICES)".
  template <typename Parse>
  auto get_named(std::string_view name, std::string_view kind, std::string_view choices,
                 Parse parse) const -> decltype(parse(std::string_view())) {
    const std::optional<std::string> value = get(name);
    if (!value) return std::nullopt;
    auto parsed = parse(*value);
    if (!parsed) {
      throw UsageError(std::string(name), "--" + std::string(name) + ": unknown " +
                                              std::string(kind) + " '" + *value + "' (" +
                                              std::string(choices) + ")");
    }
    return parsed;
  }

 private:
  friend ParsedArgs parse_args(const std::vector<FlagSpec>&, const std::vector<std::string>&);
  std::map<std::string, std::string> values_;  // switches map to ""
  bool help_requested_ = false;
};

// Parses `args` (the words after the command name) against `specs`. `-h` / `--help` set
// help_requested and stop parsing. Unknown flags, repeated flags, missing values and stray
// positional words throw UsageError.
ParsedArgs parse_args(const std::vector<FlagSpec>& specs, const std::vector<std::string>& args);

// "  --softcap C        soft-cap ..." lines, aligned, for a command's --help.
std::string format_flags(const std::vector<FlagSpec>& specs);

// Strict number parsing: the whole text must be a number; `flag` names the flag in errors.
double parse_double(std::string_view text, std::string_view flag);
int64_t parse_int(std::string_view text, std::string_view flag);
uint64_t parse_uint64(std::string_view text, std::string_view flag);

}  // namespace dpa::cli
