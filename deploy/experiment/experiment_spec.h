// An experiment (`lamina experiment SPEC.yaml`): topologies × batch limits × context lengths, each
// measured with a closed-loop bench, priced with a price table. Schema in deploy/EXPERIMENTS.md; a
// file error names the file, line and field.
// Plain values; thread-compatible.
#ifndef LAMINA_DEPLOY_EXPERIMENT_EXPERIMENT_SPEC_H_
#define LAMINA_DEPLOY_EXPERIMENT_EXPERIMENT_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lamina::experiment {

struct TopologyEntry {
  std::string name;      // as reports show it
  std::string file;      // resolved against the spec's folder
  bool baseline = false; // the homogeneous baseline the others are compared with
};

struct ExperimentSpec {
  std::string path;
  std::string name;
  std::string prices;  // price table; empty = the shipped one
  std::vector<TopologyEntry> topologies;
  std::vector<int64_t> batch_limits;     // the scheduler's max_batch, and the bench's concurrency
  std::vector<int64_t> context_lengths;  // tokens per sequence at its end: prompt + output
  int64_t output_tokens = 32;
  int64_t requests_per_batch = 3;        // a run sends max(min_requests, this × batch limit)
  int64_t min_requests = 8;
  double startup_timeout_s = 300;        // a cluster not serving by then fails its runs
  double request_timeout_s = 600;
};

absl::StatusOr<ExperimentSpec> LoadExperimentSpec(const std::string& path);

}  // namespace lamina::experiment

#endif  // LAMINA_DEPLOY_EXPERIMENT_EXPERIMENT_SPEC_H_
