#include "common/flags/flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace lamina::cli {

absl::StatusOr<Flags> Flags::Parse(const std::vector<std::string>& args, const std::set<std::string>& with_value,
                                   const std::set<std::string>& switches) {
  Flags flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_inline_value = false;
    size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_inline_value = true;
    }
    if (switches.count(name)) {
      if (has_inline_value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      flags.values_[name].push_back("true");
    } else if (with_value.count(name)) {
      if (!has_inline_value) {
        if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        value = args[++i];
      }
      flags.values_[name].push_back(value);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
  }
  return flags;
}

std::vector<std::string> Flags::All(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

std::string Flags::String(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.back();
}

absl::StatusOr<int64_t> Flags::Int(const std::string& name, int64_t fallback) const {
  if (!Has(name)) return fallback;
  int64_t value;
  if (!absl::SimpleAtoi(String(name, ""), &value)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " needs an integer, got '", String(name, ""), "'"));
  }
  return value;
}

absl::StatusOr<double> Flags::Double(const std::string& name, double fallback) const {
  if (!Has(name)) return fallback;
  double value;
  if (!absl::SimpleAtod(String(name, ""), &value)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a number, got '", String(name, ""), "'"));
  }
  return value;
}

absl::StatusOr<std::vector<int32_t>> ParseIdList(const std::string& flag, const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", std::string(item), "' is not a token id"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " has no token ids"));
  return ids;
}

}  // namespace lamina::cli
