// Writes an experiment's results: results.csv (one row per run), report.md (the topologies and
// their prices, every run, throughput per dollar against the baseline per context length, the
// plots, and any extra sections), throughput_vs_batch_ctx<N>.svg per context length and
// per_dollar_vs_context.svg, like the paper's figures 12 and 13.
// Thread-compatible.
#ifndef LAMINA_DEPLOY_EXPERIMENT_EXPERIMENT_REPORT_H_
#define LAMINA_DEPLOY_EXPERIMENT_EXPERIMENT_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "deploy/experiment/experiment_runner.h"

namespace lamina::experiment {

// The run with the best throughput per dollar of a topology at a context, over the batch limits;
// null when none succeeded.
const RunResult* BestPerDollar(const ExperimentResult& result, const std::string& topology, int64_t context);

// `extra_sections` are Markdown appended to the report (planner and simulator checks).
absl::Status WriteReport(const ExperimentResult& result, const std::string& out_dir,
                         const std::vector<std::string>& extra_sections);

}  // namespace lamina::experiment

#endif  // LAMINA_DEPLOY_EXPERIMENT_EXPERIMENT_REPORT_H_
