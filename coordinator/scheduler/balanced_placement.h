// `balanced` placement's sizing (scheduler.placement; the paper's sizing, NEO's load-aware split
// between a GPU and slower attention): a memory node takes no more of a batch's rows than it
// attends, layer by layer, within the compute node's computing of a layer, so that its rows,
// sent before the local ones are attended, come back before the compute node needs them.
// Thread-safe: a pure function.
#ifndef LAMINA_COORDINATOR_SCHEDULER_BALANCED_PLACEMENT_H_
#define LAMINA_COORDINATOR_SCHEDULER_BALANCED_PLACEMENT_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace lamina {

// The rows a memory node may hold for a batch: floor(step_compute_seconds / num_layers /
// row_attention_seconds), at least 1; no limit (the largest int64) while either rate is still
// unknown (0), as before the first steps.
inline int64_t BalancedRowCap(double step_compute_seconds, int64_t num_layers, double row_attention_seconds) {
  if (step_compute_seconds <= 0 || row_attention_seconds <= 0 || num_layers <= 0) {
    return std::numeric_limits<int64_t>::max();
  }
  const double rows = step_compute_seconds / static_cast<double>(num_layers) / row_attention_seconds;
  return std::max<int64_t>(1, static_cast<int64_t>(std::min(rows, 1e15)));
}

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SCHEDULER_BALANCED_PLACEMENT_H_
