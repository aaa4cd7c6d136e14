// `lamina experiment SPEC.yaml`: sweeps topologies × batch limits × context lengths (starting and
// stopping a cluster for each topology and batch limit), then writes a report (Markdown + CSV) and
// plots (SVG) of throughput and throughput per dollar, with the analytic model's predicted ranking
// and the simulator's predictions checked against the measurements.
#ifndef LAMINA_DEPLOY_CLI_EXPERIMENT_COMMAND_H_
#define LAMINA_DEPLOY_CLI_EXPERIMENT_COMMAND_H_

#include <string>
#include <vector>

namespace lamina::cli {

extern const char kExperimentUsage[];
int RunExperimentCommand(const std::vector<std::string>& args);

}  // namespace lamina::cli

#endif  // LAMINA_DEPLOY_CLI_EXPERIMENT_COMMAND_H_
