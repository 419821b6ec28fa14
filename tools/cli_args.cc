#include "cli_args.h"

#include <algorithm>
#include <charconv>
#include <system_error>

namespace dpa::cli {

namespace {

std::string dashed(std::string_view name) { return "--" + std::string(name); }

std::string quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

}  // namespace

double parse_double(std::string_view text, std::string_view flag) {
  double value = 0;
  // from_chars takes no leading '+'; accept it as people write "+1e-3".
  std::string_view digits = (!text.empty() && text.front() == '+') ? text.substr(1) : text;
  auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size()) {
    throw UsageError(std::string(flag), dashed(flag) + " expects a number, got " + quoted(text));
  }
  return value;
}

int64_t parse_int(std::string_view text, std::string_view flag) {
  int64_t value = 0;
  std::string_view digits = (!text.empty() && text.front() == '+') ? text.substr(1) : text;
  auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size()) {
    throw UsageError(std::string(flag), dashed(flag) + " expects an integer, got " + quoted(text));
  }
  return value;
}

uint64_t parse_uint64(std::string_view text, std::string_view flag) {
  uint64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    throw UsageError(std::string(flag),
                     dashed(flag) + " expects a non-negative integer, got " + quoted(text));
  }
  return value;
}

std::optional<std::string> ParsedArgs::get(std::string_view name) const {
  auto it = values_.find(std::string(name));
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string ParsedArgs::get_or(std::string_view name, std::string_view fallback) const {
  auto value = get(name);
  return value ? *value : std::string(fallback);
}

std::string ParsedArgs::require(std::string_view name) const {
  auto value = get(name);
  if (!value) throw UsageError(std::string(name), dashed(name) + " is required");
  return *value;
}

std::optional<double> ParsedArgs::get_double(std::string_view name) const {
  auto value = get(name);
  if (!value) return std::nullopt;
  return parse_double(*value, name);
}

std::optional<int64_t> ParsedArgs::get_int(std::string_view name) const {
  auto value = get(name);
  if (!value) return std::nullopt;
  return parse_int(*value, name);
}

std::optional<uint64_t> ParsedArgs::get_uint64(std::string_view name) const {
  auto value = get(name);
  if (!value) return std::nullopt;
  return parse_uint64(*value, name);
}

std::optional<std::vector<int64_t>> ParsedArgs::get_int_list(std::string_view name,
                                                             int count) const {
  auto value = get(name);
  if (!value) return std::nullopt;
  std::vector<int64_t> items;
  std::string_view rest = *value;
  while (true) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    try {
      items.push_back(parse_int(item, name));
    } catch (const UsageError&) {
      throw UsageError(std::string(name),
                       dashed(name) + " expects comma-separated integers, got " + quoted(*value));
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (count > 0 && int(items.size()) != count) {
    throw UsageError(std::string(name), dashed(name) + " expects " + std::to_string(count) +
                                            " comma-separated integers, got " + quoted(*value));
  }
  return items;
}

ParsedArgs parse_args(const std::vector<FlagSpec>& specs, const std::vector<std::string>& args) {
  ParsedArgs parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (word == "-h" || word == "--help") {
      parsed.help_requested_ = true;
      return parsed;
    }
    if (word.size() < 3 || word.compare(0, 2, "--") != 0) {
      throw UsageError("", "unexpected argument " + quoted(word) + " (flags start with --)");
    }
    std::string name = word.substr(2);
    std::optional<std::string> inline_value;
    if (size_t equals = name.find('='); equals != std::string::npos) {
      inline_value = name.substr(equals + 1);
      name = name.substr(0, equals);
    }
    auto spec =
        std::find_if(specs.begin(), specs.end(), [&](const FlagSpec& s) { return s.name == name; });
    if (spec == specs.end()) {
      throw UsageError(name, "unknown flag " + dashed(name) + " (see --help)");
    }
    if (parsed.values_.count(name)) {
      throw UsageError(name, dashed(name) + " is given more than once");
    }
    if (spec->value_name.empty()) {
      if (inline_value) throw UsageError(name, dashed(name) + " takes no value");
      parsed.values_[name] = "";
      continue;
    }
    if (inline_value) {
      parsed.values_[name] = *inline_value;
      continue;
    }
    // The next word is the value even when it starts with '-' (e.g. --softcap -1), so that
    // a negative number reaches validation instead of being taken for a flag; but a word that
    // starts with "--" is the next flag, and the value is missing (--softcap --scale 1 must
    // blame --softcap, not '1').
    if (i + 1 >= args.size() || args[i + 1].compare(0, 2, "--") == 0) {
      throw UsageError(name, dashed(name) + " needs a value (" + spec->value_name + ")");
    }
    parsed.values_[name] = args[++i];
  }
  return parsed;
}

std::string format_flags(const std::vector<FlagSpec>& specs) {
  size_t width = 0;
  std::vector<std::string> heads;
  for (const FlagSpec& spec : specs) {
    std::string head = dashed(spec.name);
    if (!spec.value_name.empty()) head += " " + spec.value_name;
    width = std::max(width, head.size());
    heads.push_back(head);
  }
  std::string text;
  for (size_t i = 0; i < specs.size(); ++i) {
    text += "  " + heads[i] + std::string(width - heads[i].size() + 2, ' ') + specs[i].help + "\n";
  }
  return text;
}

}  // namespace dpa::cli
