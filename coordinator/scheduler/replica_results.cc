#include "coordinator/scheduler/replica_results.h"

#include "absl/status/status.h"

namespace lamina {

absl::StatusOr<lamina::v1::StepResult> MergeReplicaResults(
    const std::vector<absl::StatusOr<lamina::v1::StepResult>>& results, int last_replica) {
  if (results.empty()) return absl::InternalError("a step with no compute node");
  for (const auto& result : results) {
    if (!result.ok()) return result;
  }
  for (const auto& result : results) {
    if (result->failed_memory_nodes_size() > 0) return result;
  }
  for (const auto& result : results) {
    if (result->error_code() != 0) return result;
  }
  if (last_replica < 0) return results[0];
  if (last_replica >= static_cast<int>(results.size())) {
    return absl::InternalError("the replica that ran the last slice did not answer");
  }
  return results[last_replica];
}

}  // namespace lamina
