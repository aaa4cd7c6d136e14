// Reads one YAML mapping of a configuration file (topology, workload, price table, experiment),
// naming the file, line and field path in every error ("x.yaml:12: nodes[2].port: expected an
// integer from 1 to 65535, got 'lots'") and refusing fields it does not know.
// Thread-compatible.
#ifndef LAMINA_COMMON_YAML_YAML_FIELDS_H_
#define LAMINA_COMMON_YAML_YAML_FIELDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "yaml-cpp/yaml.h"

namespace lamina {

// Parses YAML text; a syntax error names the file and line.
absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, const std::string& path);
// Reads and parses a file; a missing file is NotFound naming it.
absl::StatusOr<YAML::Node> LoadYamlFile(const std::string& path);
// A path written in `file`: relative paths resolve against the file's folder; "" stays "".
std::string ResolveAgainstFile(const std::string& path, const std::string& file);

class YamlFields {
 public:
  // `where` is the mapping's path in the file ("" for the top level, "nodes[2]", ...).
  YamlFields(const YAML::Node& node, std::string path, std::string where, std::vector<std::string> allowed)
      : node_(node), path_(std::move(path)), where_(std::move(where)), allowed_(std::move(allowed)) {}

  // The node is a mapping whose keys are all allowed.
  absl::Status CheckShape() const;
  absl::Status Error(const YAML::Node& at, const std::string& field, const std::string& what) const;
  std::string Qualified(const std::string& field) const { return where_.empty() ? field : where_ + "." + field; }
  const std::string& path() const { return path_; }

  bool Has(const std::string& field) const { return node_[field].IsDefined() && !node_[field].IsNull(); }
  YAML::Node Get(const std::string& field) const { return node_[field]; }

  // A missing field takes `*fallback`, or is an error when `fallback` is null.
  absl::StatusOr<std::string> String(const std::string& field, const std::string* fallback) const;
  absl::StatusOr<bool> Bool(const std::string& field, bool fallback) const;
  absl::StatusOr<int64_t> Integer(const std::string& field, const int64_t* fallback, int64_t min, int64_t max) const;
  absl::StatusOr<double> Double(const std::string& field, const double* fallback, double min, double max) const;
  // A list of integers (each in [min, max]), at least one.
  absl::StatusOr<std::vector<int64_t>> IntegerList(const std::string& field, int64_t min, int64_t max) const;

 private:
  absl::Status Missing(const std::string& field) const;

  YAML::Node node_;
  std::string path_;
  std::string where_;
  std::vector<std::string> allowed_;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_YAML_YAML_FIELDS_H_
