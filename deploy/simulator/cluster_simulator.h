// A discrete-event simulator of a Lamina cluster larger than any we can run: `replicas` compute
// nodes, each with its own memory nodes, behind one coordinator whose per-iteration work is
// serial across them. Each replica batches continuously like the real scheduler (admits waiting
// requests while the batch limit, the iteration's token budget and its KV capacity allow; a
// request's prompt is prefilled in the iteration that admits it), and iterations cost what the
// fitted CostModel says. With several batches in flight per compute node (CostModel::batches,
// the measured topology's pipelining), each batch runs its own iterations, sharing the replica's
// KV capacity and taking up to its equal share of what runs or waits, as the scheduler's do. It
// predicts throughput, latency percentiles and utilisation, and names the bottleneck.
// Pure function of its inputs; thread-safe.
#ifndef LAMINA_DEPLOY_SIMULATOR_CLUSTER_SIMULATOR_H_
#define LAMINA_DEPLOY_SIMULATOR_CLUSTER_SIMULATOR_H_

#include <string>
#include <vector>

#include "deploy/bench/bench_report.h"
#include "deploy/bench/workload.h"
#include "deploy/simulator/cost_model.h"

namespace lamina::simulator {

struct ClusterShape {
  int replicas = 1;                  // compute nodes
  int memory_nodes_per_replica = 1;
  int64_t max_batch = 64;            // per batch (a replica runs CostModel::batches)
};

struct SimulationResult {
  int requests = 0;
  double wall_s = 0;
  int64_t output_tokens = 0;
  double output_tokens_per_s = 0;
  bench::Percentiles ttft_ms, tpot_ms;
  double compute_busy = 0;      // mean over replicas and their batches in flight
  double attention_share = 0;   // of the compute nodes' busy time, waiting on attention
  double coordinator_busy = 0;
  double kv_blocked = 0;        // share of admissions stopped by KV capacity while requests waited
  double mean_batch = 0;
  std::string bottleneck;
};

// `requests` from bench::MakeRequests; closed loop keeps `workload.concurrency` in flight over the
// whole cluster, open loop sends each at its arrival time.
SimulationResult Simulate(const CostModel& costs, const ClusterShape& shape, const bench::WorkloadSpec& workload,
                          const std::vector<bench::BenchRequest>& requests);

}  // namespace lamina::simulator

#endif  // LAMINA_DEPLOY_SIMULATOR_CLUSTER_SIMULATOR_H_
