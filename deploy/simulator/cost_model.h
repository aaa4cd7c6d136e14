// Measured per-operation costs for the simulator, fitted from bench runs of one topology (a compute
// node and its memory nodes). One iteration that decodes B sequences attending over A tokens in all
// and prefills P prompt tokens keeps the compute node for
//   step_fixed + B·step_per_sequence + (A/1000)·attention_per_ktoken·(measured memory nodes ÷ memory nodes) + P·prefill_per_token
// milliseconds (attention splits over the memory nodes), and the coordinator for coordinator_ms
// of serial work between iterations; with several batches in flight (`batches`), each batch's
// iterations cost that. Saved as YAML (`lamina simulate --costs`).
// Plain values; thread-compatible.
#ifndef LAMINA_DEPLOY_SIMULATOR_COST_MODEL_H_
#define LAMINA_DEPLOY_SIMULATOR_COST_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lamina::simulator {

struct CostModel {
  double step_fixed_ms = 0;
  double step_per_sequence_ms = 0;
  double attention_per_ktoken_ms = 0;
  double prefill_per_token_ms = 0;
  double coordinator_ms = 0;
  int memory_nodes = 1;                 // in the measured topology
  int64_t kv_capacity_tokens = 0;       // per memory node
  int64_t max_tokens_per_iteration = 4096;
  bool chunked_prefill = true;          // the topology's scheduler.chunked_prefill
  // Batches in flight per compute node in the measured topology (its pipelining: 1 for `none`,
  // 2 for `rotational` on one compute node; `fixed`'s batches, one a compute node, count as a
  // node's own here as they share its memory nodes). Each runs its own iterations, which the fit
  // timed as they ran side by side.
  int batches = 1;
  // With batches > 1 under `pipelining: auto`: the batches after the first take requests only
  // while more than this many sequences run or wait (scheduler.rotational_above); < 0: always.
  int64_t more_batches_above = -1;
  std::string source;                   // what it was fitted from

  // The compute node's time for one iteration with `memory_nodes` memory nodes sharing attention.
  double IterationMs(double batch, double attended_tokens, double prefill_tokens, int memory_nodes) const;
  // The share of that time spent in attention.
  double AttentionMs(double attended_tokens, int memory_nodes) const;
};

// One bench run's per-iteration means.
struct CalibrationPoint {
  double batch = 0;           // sequences decoded per iteration
  double context = 0;         // mean tokens a decoded sequence attends over
  double prefill_tokens = 0;  // per iteration
  double iteration_ms = 0;    // the compute node's time per iteration, as the coordinator waits on it
  double period_ms = 0;       // wall time per iteration, coordinator work included
};

// Least squares with non-negative coefficients; InvalidArgument with fewer than two points.
absl::StatusOr<CostModel> FitCostModel(const std::vector<CalibrationPoint>& points, int memory_nodes,
                                       int64_t kv_capacity_tokens, const std::string& source);
// The fit's predicted iteration time for a point, to report residuals.
double PredictIterationMs(const CostModel& costs, const CalibrationPoint& point);

std::string CostModelToYaml(const CostModel& costs);
absl::StatusOr<CostModel> LoadCostModel(const std::string& path);

}  // namespace lamina::simulator

#endif  // LAMINA_DEPLOY_SIMULATOR_COST_MODEL_H_
