// The one outcome of a step that went to every compute node of a batch: under rotational
// pipelining or a layer split over R > 1 compute nodes every replica answers each plan, and the tokens come from
// the one that ran the last slice. Pure function; thread-safe.
#ifndef LAMINA_COORDINATOR_SCHEDULER_REPLICA_RESULTS_H_
#define LAMINA_COORDINATOR_SCHEDULER_REPLICA_RESULTS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "lamina/v1/node.pb.h"

namespace lamina {

// `results[r]` is replica r's answer (a single one when the batch runs on one compute node:
// `last_replica` -1). In order:
//   1. a replica that could not answer (its stream broke: the node may have died), as the
//      others' failures may follow from it: their waits on its hand-overs give up, and so do the
//      memory nodes' waits on them, which they then report unreachable;
//   2. a result naming unreachable memory nodes (the step then runs again without them);
//   3. any other failed result;
//   4. otherwise the result of `last_replica`, which ran the last slice (SliceRoute::OwnerOf).
absl::StatusOr<lamina::v1::StepResult> MergeReplicaResults(
    const std::vector<absl::StatusOr<lamina::v1::StepResult>>& results, int last_replica);

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SCHEDULER_REPLICA_RESULTS_H_
