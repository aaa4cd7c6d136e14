// `lamina plan`'s search: every compute device kind of the price table, as one device or, when the
// weights need more, the fewest that hold them (colocated as a tensor-parallel group, offloaded as a
// layer split: what each serves so far); colocated and with each memory kind at its best device count (BestMemoryDevices at the table's
// price ratio), ranked by predicted tokens/s per dollar-hour. With pipelining, each offloaded design
// also carries the paper's balanced memory-device count (BalancedMemoryDevices).
// Pure functions; thread-safe.
#ifndef LAMINA_DEPLOY_PLANNER_PLANNER_H_
#define LAMINA_DEPLOY_PLANNER_PLANNER_H_

#include <set>
#include <string>
#include <vector>

#include "deploy/bench/workload.h"
#include "deploy/planner/analytic_model.h"

namespace lamina::planner {

struct PlanOptions {
  std::set<std::string> compute_kinds;  // empty: every kind in the table
  std::set<std::string> memory_kinds;   // empty: every kind in the table
  bool pipelined = false;
  int64_t max_batch = 4096;
  double tpot_target_s = 0;
  Efficiency efficiency;
};

// Mean prompt and output lengths of a workload (bin midpoints for a distribution); InvalidArgument
// for a prompts file, whose lengths are unknown until tokenized.
absl::Status MeanLengths(const bench::WorkloadSpec& workload, double* prompt_tokens, double* output_tokens);

// The mean context a decoding sequence attends over: its prompt and half its output.
inline double MeanDecodeContext(double prompt_tokens, double output_tokens) { return prompt_tokens + output_tokens / 2; }

// Feasible designs first, best first; infeasible ones after, with the reason.
std::vector<Prediction> Plan(const ModelShape& model, double context, const PriceTable& table,
                             const PlanOptions& options);

}  // namespace lamina::planner

#endif  // LAMINA_DEPLOY_PLANNER_PLANNER_H_
