// Runs an experiment: for each topology and batch limit, starts the cluster (the topology with the
// scheduler's max_batch set to the limit), benches every context length against it with a closed
// loop of `batch limit` requests in flight, and stops it. A run that fails (the cluster does not
// start, or every request fails) is recorded with its error and the experiment goes on.
// Thread-compatible.
#ifndef LAMINA_DEPLOY_EXPERIMENT_EXPERIMENT_RUNNER_H_
#define LAMINA_DEPLOY_EXPERIMENT_EXPERIMENT_RUNNER_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deploy/bench/bench_report.h"
#include "deploy/cost/price_table.h"
#include "deploy/experiment/experiment_spec.h"

namespace lamina::experiment {

struct RunResult {
  std::string topology;
  bool baseline = false;
  int64_t batch_limit = 0;
  int64_t context = 0;        // prompt + output tokens
  absl::Status status;        // not OK: the run produced no figures
  bench::BenchReport bench;
  double hourly_usd = 0;
  double compute_busy = 0;    // mean over compute nodes
  double memory_busy = 0;     // mean over memory nodes
  double kv_peak = 0;         // highest over memory nodes
};

struct TopologyInfo {
  TopologyEntry entry;
  std::string model_name;
  int compute_nodes = 0;
  int memory_nodes = 0;
  int64_t kv_capacity_tokens = 0;
  TopologyCost cost;
};

struct ExperimentResult {
  ExperimentSpec spec;
  PriceTable prices;
  std::vector<TopologyInfo> topologies;
  std::vector<RunResult> runs;
};

struct ExperimentOptions {
  std::string lamina_binary;  // runs `lamina up`
  std::string out_dir;        // topologies written for each run, and the clusters' logs
  bool show_progress = true;
};

// Fails before starting anything when a topology does not load or cannot be priced.
absl::StatusOr<ExperimentResult> RunExperiment(const ExperimentSpec& spec, const ExperimentOptions& options);

}  // namespace lamina::experiment

#endif  // LAMINA_DEPLOY_EXPERIMENT_EXPERIMENT_RUNNER_H_
