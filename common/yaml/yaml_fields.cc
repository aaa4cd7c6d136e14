#include "common/yaml/yaml_fields.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lamina {
namespace {

std::string Shown(const YAML::Node& value) { return value.IsScalar() ? value.Scalar() : "a non-scalar"; }

}  // namespace

absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, const std::string& path) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", e.mark.line + 1, ": not valid YAML: ", e.msg));
  }
}

absl::StatusOr<YAML::Node> LoadYamlFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the file"));
  std::stringstream text;
  text << in.rdbuf();
  return ParseYaml(text.str(), path);
}

std::string ResolveAgainstFile(const std::string& path, const std::string& file) {
  if (path.empty() || std::filesystem::path(path).is_absolute()) return path;
  return (std::filesystem::path(file).parent_path() / path).lexically_normal().string();
}

absl::Status YamlFields::CheckShape() const {
  if (!node_.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ":", node_.Mark().line + 1, ": ",
                                                   where_.empty() ? "the file" : where_, ": expected a mapping"));
  }
  std::map<std::string, int> first_line;  // of each key seen
  for (const auto& entry : node_) {
    const std::string key = entry.first.as<std::string>();
    if (std::find(allowed_.begin(), allowed_.end(), key) == allowed_.end()) {
      return Error(entry.first, key, absl::StrCat("unknown field (allowed: ", absl::StrJoin(allowed_, ", "), ")"));
    }
    // YAML forbids a key twice in a mapping, and a reader would take one of them silently.
    auto [seen, added] = first_line.emplace(key, entry.first.Mark().line + 1);
    if (!added) return Error(entry.first, key, absl::StrCat("given twice (first on line ", seen->second, ")"));
  }
  return absl::OkStatus();
}

absl::Status YamlFields::Error(const YAML::Node& at, const std::string& field, const std::string& what) const {
  return absl::InvalidArgumentError(absl::StrCat(path_, ":", at.Mark().line + 1, ": ", Qualified(field), ": ", what));
}

absl::Status YamlFields::Missing(const std::string& field) const {
  return absl::InvalidArgumentError(absl::StrCat(path_, ":", node_.Mark().line + 1, ": ", Qualified(field), ": missing"));
}

absl::StatusOr<std::string> YamlFields::String(const std::string& field, const std::string* fallback) const {
  if (!Has(field)) {
    if (fallback) return *fallback;
    return Missing(field);
  }
  YAML::Node value = node_[field];
  if (!value.IsScalar()) return Error(value, field, "expected a string");
  return value.as<std::string>();
}

absl::StatusOr<bool> YamlFields::Bool(const std::string& field, bool fallback) const {
  if (!Has(field)) return fallback;
  YAML::Node value = node_[field];
  if (value.IsScalar() && (value.Scalar() == "true" || value.Scalar() == "false")) return value.Scalar() == "true";
  return Error(value, field, absl::StrCat("expected true or false, got '", Shown(value), "'"));
}

absl::StatusOr<int64_t> YamlFields::Integer(const std::string& field, const int64_t* fallback, int64_t min,
                                            int64_t max) const {
  if (!Has(field)) {
    if (fallback) return *fallback;
    return Missing(field);
  }
  YAML::Node value = node_[field];
  int64_t parsed;
  if (!value.IsScalar() || !absl::SimpleAtoi(value.Scalar(), &parsed) || parsed < min || parsed > max) {
    return Error(value, field, absl::StrCat("expected an integer from ", min, " to ", max, ", got '", Shown(value), "'"));
  }
  return parsed;
}

absl::StatusOr<double> YamlFields::Double(const std::string& field, const double* fallback, double min,
                                          double max) const {
  if (!Has(field)) {
    if (fallback) return *fallback;
    return Missing(field);
  }
  YAML::Node value = node_[field];
  double parsed;
  if (!value.IsScalar() || !absl::SimpleAtod(value.Scalar(), &parsed) || !std::isfinite(parsed) || parsed < min ||
      parsed > max) {
    return Error(value, field, absl::StrCat("expected a number from ", min, " to ", max, ", got '", Shown(value), "'"));
  }
  return parsed;
}

absl::StatusOr<std::vector<int64_t>> YamlFields::IntegerList(const std::string& field, int64_t min,
                                                             int64_t max) const {
  if (!Has(field)) return Missing(field);
  YAML::Node list = node_[field];
  if (!list.IsSequence() || list.size() == 0) return Error(list, field, "expected a list of integers, at least one");
  std::vector<int64_t> out;
  for (size_t i = 0; i < list.size(); ++i) {
    int64_t parsed;
    if (!list[i].IsScalar() || !absl::SimpleAtoi(list[i].Scalar(), &parsed) || parsed < min || parsed > max) {
      return Error(list[i], absl::StrCat(field, "[", i, "]"),
                   absl::StrCat("expected an integer from ", min, " to ", max, ", got '", Shown(list[i]), "'"));
    }
    out.push_back(parsed);
  }
  return out;
}

}  // namespace lamina
