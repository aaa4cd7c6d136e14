#include "deploy/cli/simulate_command.h"

#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/flags/flags.h"
#include "common/status/status_macros.h"
#include "deploy/simulator/cluster_simulator.h"

namespace lamina::cli {

const char kSimulateUsage[] =
    "usage: lamina simulate --costs FILE --workload FILE [--replicas R[,R...]] [--memory-nodes M]\n"
    "                       [--max-batch B] [--max-context N]\n"
    "  Predicts a cluster of R compute nodes (each with M memory nodes, one coordinator for all) from\n"
    "  measured per-operation costs (an experiment's costs-TOPOLOGY.yaml): tokens/s, latency\n"
    "  percentiles, utilisation and the bottleneck. A closed-loop workload's concurrency is per\n"
    "  compute node; an open loop's rate is for the whole cluster. Each compute node runs the batches\n"
    "  in flight the costs were measured with (their `batches`: the topology's pipelining).\n";

namespace {

absl::Status Simulate(const std::vector<std::string>& args) {
  LAMINA_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(args, {"costs", "workload", "replicas", "memory-nodes",
                                                           "max-batch", "max-context"},
                                                    {}));
  if (!flags.Has("costs") || !flags.Has("workload")) {
    return absl::InvalidArgumentError("--costs FILE and --workload FILE are required");
  }
  LAMINA_ASSIGN_OR_RETURN(simulator::CostModel costs, simulator::LoadCostModel(flags.String("costs", "")));
  LAMINA_ASSIGN_OR_RETURN(bench::WorkloadSpec workload, bench::LoadWorkload(flags.String("workload", "")));
  std::vector<int> replica_counts;
  for (absl::string_view item : absl::StrSplit(flags.String("replicas", "1"), ',', absl::SkipEmpty())) {
    int r;
    if (!absl::SimpleAtoi(item, &r) || r < 1 || r > 100000) {
      return absl::InvalidArgumentError("--replicas: expected positive integers, e.g. 1,8,64");
    }
    replica_counts.push_back(r);
  }
  LAMINA_ASSIGN_OR_RETURN(int64_t memory_nodes, flags.Int("memory-nodes", costs.memory_nodes));
  LAMINA_ASSIGN_OR_RETURN(int64_t max_batch, flags.Int("max-batch", 64));
  LAMINA_ASSIGN_OR_RETURN(int64_t max_context, flags.Int("max-context", 1 << 20));
  if (memory_nodes < 1 || max_batch < 1) return absl::InvalidArgumentError("--memory-nodes and --max-batch must be >= 1");

  std::printf("costs %s; %lld memory nodes, batch limit %lld and %d batches in flight per compute node\n",
              costs.source.c_str(), static_cast<long long>(memory_nodes), static_cast<long long>(max_batch),
              costs.batches);
  std::printf("%8s %8s %12s %10s %10s %10s %9s %9s  %s\n", "compute", "memory", "tokens/s", "TTFT p50", "TPOT p50",
              "TPOT p99", "compute", "coord.", "bottleneck");
  for (int replicas : replica_counts) {
    bench::WorkloadSpec scaled = workload;
    if (scaled.mode == bench::ArrivalMode::kClosedLoop) scaled.concurrency *= replicas;
    scaled.requests = std::max(scaled.requests, scaled.requests * replicas);
    LAMINA_ASSIGN_OR_RETURN(std::vector<bench::BenchRequest> requests,
                            bench::MakeRequests(scaled, 32000, static_cast<int>(max_context)));
    const simulator::SimulationResult r =
        simulator::Simulate(costs, {replicas, static_cast<int>(memory_nodes), max_batch}, scaled, requests);
    std::printf("%8d %8lld %12.1f %8.1fms %8.2fms %8.2fms %8.0f%% %8.0f%%  %s\n", replicas,
                static_cast<long long>(replicas * memory_nodes), r.output_tokens_per_s, r.ttft_ms.p50, r.tpot_ms.p50,
                r.tpot_ms.p99, 100 * r.compute_busy, 100 * r.coordinator_busy, r.bottleneck.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunSimulateCommand(const std::vector<std::string>& args) {
  absl::Status status = Simulate(args);
  if (status.ok()) return 0;
  std::fprintf(stderr, "lamina simulate: %s\n", std::string(status.message()).c_str());
  return absl::IsInvalidArgument(status) ? 2 : 1;
}

}  // namespace lamina::cli
