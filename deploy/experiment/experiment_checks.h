// The model checks of an experiment report:
// - the planner: the analytic model's predicted tokens/s per dollar-hour for each topology (its
//   devices from the price table, its KV capacity from the topology) ranked per context length,
//   against the measured ranking;
// - the simulator: per-operation costs fitted from each topology's runs (written as
//   costs-TOPOLOGY.yaml for `lamina simulate`), every run simulated, and the error against the
//   measured throughput.
// Each returns a Markdown section. Thread-compatible.
#ifndef LAMINA_DEPLOY_EXPERIMENT_EXPERIMENT_CHECKS_H_
#define LAMINA_DEPLOY_EXPERIMENT_EXPERIMENT_CHECKS_H_

#include <string>

#include "absl/status/statusor.h"
#include "deploy/experiment/experiment_runner.h"

namespace lamina::experiment {

absl::StatusOr<std::string> PlannerSection(const ExperimentResult& result);
absl::StatusOr<std::string> SimulatorSection(const ExperimentResult& result, const std::string& out_dir);

}  // namespace lamina::experiment

#endif  // LAMINA_DEPLOY_EXPERIMENT_EXPERIMENT_CHECKS_H_
