// `balanced` placement's sizing (scheduler.placement; the paper's sizing, NEO's load-aware split
// between a GPU and slower attention): a memory node takes no more of a batch's rows than it
// attends, layer by layer, within the compute node's computing of a layer, so that its rows,
// sent before the local ones are attended, come back before the compute node needs them; and
// none at all once the batch's steps show that its rows slow the batch more than they add.
#ifndef LAMINA_COORDINATOR_SCHEDULER_BALANCED_PLACEMENT_H_
#define LAMINA_COORDINATOR_SCHEDULER_BALANCED_PLACEMENT_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace lamina {

// The rows a memory node may hold for a batch: floor(step_seconds / num_layers /
// row_attention_seconds), at least 1, where step_seconds is a decode step's time with every row
// in the compute node's pool (DecodePace). While either rate is still unknown (0, before the first
// steps) one row probes it: a burst of requests at start-up must not land on a memory node that
// turns out slower than the compute node.
inline int64_t BalancedRowCap(double step_seconds, int64_t num_layers, double row_attention_seconds) {
  if (step_seconds <= 0 || row_attention_seconds <= 0 || num_layers <= 0) return 1;
  const double rows = step_seconds / static_cast<double>(num_layers) / row_attention_seconds;
  return std::max<int64_t>(1, static_cast<int64_t>(std::min(rows, 1e15)));
}

// What the batch's decode steps say about offloading, measured by the coordinator (plan sent to
// result back): the time of a step whose rows are all in the compute node's pool, and the gain of
// steps with rows on memory nodes too, ((local + remote rows) / their step's time) divided by
// (local rows / a local step's time). A GPU runs a local step as one CUDA graph but a mixed one
// layer by layer through host memory, so a memory node slower than the path can cost the whole
// batch more than its rows add. Thread-compatible.
class DecodePace {
 public:
  // One decode step (no prompt in it) of `local_rows` + `remote_rows` rows that took `seconds`.
  void Record(int64_t local_rows, int64_t remote_rows, double seconds) {
    if (seconds <= 0 || local_rows <= 0) return;
    if (remote_rows == 0) {
      local_step_seconds_ = Blend(local_step_seconds_, seconds);
    } else if (local_step_seconds_ > 0) {
      const double with = static_cast<double>(local_rows + remote_rows) / seconds;
      const double without = static_cast<double>(local_rows) / local_step_seconds_;
      gain_ = Blend(gain_, with / without);
    }
  }
  // A local step's time (0: none measured yet).
  double local_step_seconds() const { return local_step_seconds_; }
  // Offloading's gain (0: not measured yet).
  double gain() const { return gain_; }
  // False once steps with rows on memory nodes served fewer rows a second than the pool's alone.
  bool OffloadingPays() const { return gain_ == 0 || gain_ >= 1; }

 private:
  // Recent steps weigh most: each new one half.
  static double Blend(double average, double sample) { return average > 0 ? 0.5 * average + 0.5 * sample : sample; }

  double local_step_seconds_ = 0;
  double gain_ = 0;
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SCHEDULER_BALANCED_PLACEMENT_H_
