// Whether the memory nodes keep up with the compute node under rotational pipelining, judged from
// what the nodes measured. The paper sizes the memory devices so that one batch's attention takes
// no longer than t_m / (n - 1), where t_m is the compute time of a step and n the batches in
// flight over n - 1 compute replicas: then each replica always has another batch's slices to run.
// With two batches on one compute node, attention must take at most the computing time.
// Attention time is taken to shrink in proportion to the number of memory nodes (their KV reads
// split evenly), which is what the estimate of the nodes needed assumes.
#ifndef LAMINA_DEPLOY_PLANNER_PIPELINE_BALANCE_H_
#define LAMINA_DEPLOY_PLANNER_PIPELINE_BALANCE_H_

#include <optional>
#include <string>

#include "lamina/v1/cluster.pb.h"

namespace lamina::planner {

struct PipelineBalance {
  int batches = 0;                  // batches in flight
  double compute_ms = 0;            // per plan, computing (compute nodes' mean)
  double attention_ms = 0;          // per plan, waiting on attention round trips
  int memory_nodes = 0;             // live ones
  int memory_nodes_needed = 0;      // for attention <= compute / (batches - 1)
  bool balanced() const { return memory_nodes_needed <= memory_nodes; }
  // One line for `lamina status`.
  std::string Describe() const;
};

// Nullopt when the cluster runs one batch, or its compute nodes have not run a plan yet.
std::optional<PipelineBalance> MeasureBalance(const lamina::v1::ClusterStatusResponse& status);

}  // namespace lamina::planner

#endif  // LAMINA_DEPLOY_PLANNER_PIPELINE_BALANCE_H_
