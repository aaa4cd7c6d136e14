#include "deploy/planner/pipeline_balance.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace lamina::planner {

std::optional<PipelineBalance> MeasureBalance(const lamina::v1::ClusterStatusResponse& status) {
  PipelineBalance b;
  b.batches = status.running_per_batch_size();
  int computes = 0;
  int64_t plans = 0;
  double computing_s = 0, waiting_s = 0;
  for (const auto& node : status.nodes()) {
    if (node.role() == lamina::v1::NODE_ROLE_MEMORY) {
      if (node.healthy()) ++b.memory_nodes;
      continue;
    }
    ++computes;
    plans += node.load().busy_count();
    computing_s += node.load().busy_seconds();
    waiting_s += node.load().round_trip_seconds();
  }
  // Rotational: n batches over n - 1 compute nodes. Fixed pipelining (a batch per compute node)
  // and a single batch have nothing to balance.
  if (b.batches < 2 || computes != b.batches - 1 || plans == 0 || computing_s <= 0) return std::nullopt;
  b.compute_ms = 1e3 * computing_s / static_cast<double>(plans);
  b.attention_ms = 1e3 * waiting_s / static_cast<double>(plans);
  const double allowed_ms = b.compute_ms / (b.batches - 1);
  b.memory_nodes_needed = static_cast<int>(std::ceil(b.memory_nodes * b.attention_ms / allowed_ms - 1e-9));
  return b;
}

std::string PipelineBalance::Describe() const {
  const std::string measured = absl::StrFormat(
      "pipeline balance: a plan computes %.2f ms and waits %.2f ms on attention", compute_ms, attention_ms);
  if (balanced()) return absl::StrFormat("%s: the %d memory nodes keep up", measured, memory_nodes);
  return absl::StrFormat("%s: attention should take at most %.2f ms for %d batches to overlap; about %d memory "
                         "nodes would (%d now)",
                         measured, compute_ms / (batches - 1), batches, memory_nodes_needed, memory_nodes);
}

}  // namespace lamina::planner
