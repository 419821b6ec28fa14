// libFuzzer harness for the CLI's argument parser and the config validation: the input is a
// list of words (separated by '\n'), parsed with the config flags of `dpa attention` and
// turned into a validated AttentionConfig. Every outcome must be success, a UsageError or a
// dpa::Error; a crash, a sanitizer report or another exception is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cli_args.h"
#include "cli_config.h"
#include "dpa/attention.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> words(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      words.emplace_back();
    } else {
      words.back() += char(data[i]);
    }
  }
  try {
    const dpa::cli::ParsedArgs args = dpa::cli::parse_args(dpa::cli::config_flag_specs(), words);
    const dpa::AttentionConfig config =
        dpa::cli::parse_config(args, args.has("softmax-type"), args.has("bias-type"));
    (void)dpa::cli::parse_rng(args);
    dpa::DotProductAttention attention(config);  // validates every value
  } catch (const dpa::cli::UsageError&) {
  } catch (const dpa::Error&) {
  }
  return 0;
}
