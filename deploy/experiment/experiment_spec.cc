#include "deploy/experiment/experiment_spec.h"

#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/yaml/yaml_fields.h"

namespace lamina::experiment {

absl::StatusOr<ExperimentSpec> LoadExperimentSpec(const std::string& path) {
  LAMINA_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  ExperimentSpec spec;
  spec.path = path;
  try {
    YamlFields f(root, path, "",
                 {"name", "prices", "topologies", "batch_limits", "context_lengths", "output_tokens",
                  "requests_per_batch", "min_requests", "startup_timeout_s", "request_timeout_s"});
    LAMINA_RETURN_IF_ERROR(f.CheckShape());
    const std::string stem = std::filesystem::path(path).stem().string(), none;
    LAMINA_ASSIGN_OR_RETURN(spec.name, f.String("name", &stem));
    LAMINA_ASSIGN_OR_RETURN(std::string prices, f.String("prices", &none));
    spec.prices = ResolveAgainstFile(prices, path);
    LAMINA_ASSIGN_OR_RETURN(spec.batch_limits, f.IntegerList("batch_limits", 1, 1 << 20));
    LAMINA_ASSIGN_OR_RETURN(spec.context_lengths, f.IntegerList("context_lengths", 2, 1 << 24));
    const int64_t defaults[] = {spec.output_tokens, spec.requests_per_batch, spec.min_requests};
    LAMINA_ASSIGN_OR_RETURN(spec.output_tokens, f.Integer("output_tokens", &defaults[0], 1, 1 << 24));
    LAMINA_ASSIGN_OR_RETURN(spec.requests_per_batch, f.Integer("requests_per_batch", &defaults[1], 1, 1 << 20));
    LAMINA_ASSIGN_OR_RETURN(spec.min_requests, f.Integer("min_requests", &defaults[2], 1, 1 << 24));
    const double startup = spec.startup_timeout_s, request = spec.request_timeout_s;
    LAMINA_ASSIGN_OR_RETURN(spec.startup_timeout_s, f.Double("startup_timeout_s", &startup, 1, 1e6));
    LAMINA_ASSIGN_OR_RETURN(spec.request_timeout_s, f.Double("request_timeout_s", &request, 1e-3, 1e6));
    for (size_t i = 0; i < spec.context_lengths.size(); ++i) {
      if (spec.context_lengths[i] <= spec.output_tokens) {
        return f.Error(f.Get("context_lengths")[i], absl::StrCat("context_lengths[", i, "]"),
                       absl::StrCat("must exceed output_tokens (", spec.output_tokens,
                                    "): a context is prompt + output tokens"));
      }
    }
    YAML::Node list = f.Get("topologies");
    if (!list.IsSequence() || list.size() == 0) return f.Error(list, "topologies", "expected a list, at least one");
    std::set<std::string> names;
    int baselines = 0;
    for (size_t i = 0; i < list.size(); ++i) {
      YamlFields t(list[i], path, absl::StrCat("topologies[", i, "]"), {"name", "file", "baseline"});
      LAMINA_RETURN_IF_ERROR(t.CheckShape());
      TopologyEntry entry;
      LAMINA_ASSIGN_OR_RETURN(entry.file, t.String("file", nullptr));
      entry.file = ResolveAgainstFile(entry.file, path);
      const std::string stem_of_file = std::filesystem::path(entry.file).stem().string();
      LAMINA_ASSIGN_OR_RETURN(entry.name, t.String("name", &stem_of_file));
      LAMINA_ASSIGN_OR_RETURN(entry.baseline, t.Bool("baseline", false));
      if (!names.insert(entry.name).second) return t.Error(list[i], "name", absl::StrCat("'", entry.name, "' twice"));
      baselines += entry.baseline;
      spec.topologies.push_back(entry);
    }
    if (baselines > 1) return f.Error(list, "topologies", "at most one topology can be the baseline");
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", e.mark.line + 1, ": ", e.msg));
  }
  return spec;
}

}  // namespace lamina::experiment
