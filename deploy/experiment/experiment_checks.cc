#include "deploy/experiment/experiment_checks.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model_config/model_config.h"
#include "common/status/status_macros.h"
#include "common/topology/kv_dtype.h"
#include "common/topology/topology.h"
#include "deploy/experiment/experiment_report.h"
#include "deploy/planner/analytic_model.h"
#include "deploy/simulator/cluster_simulator.h"

namespace lamina::experiment {
namespace {

// The planner's design of a topology: its compute device, and its memory devices unless they all
// share the compute node's device (colocated).
absl::StatusOr<planner::Design> DesignOf(const Topology& topology, const PriceTable& table) {
  planner::Design design;
  const NodeSpec* compute = topology.NodesOf(NodeKind::kCompute).front();
  LAMINA_ASSIGN_OR_RETURN(design.compute, table.Find(compute->price_kind));
  std::set<std::tuple<std::string, std::string, std::string>> devices;
  for (const NodeSpec* node : topology.KvNodes()) {  // memory nodes and compute nodes' own pools
    design.kv_capacity_tokens += node->kv_capacity_tokens;
    if (node->kind == NodeKind::kCompute ||
        (node->host == compute->host && node->device == compute->device && node->price_kind == compute->price_kind)) {
      continue;
    }
    LAMINA_ASSIGN_OR_RETURN(design.memory, table.Find(node->price_kind));
    devices.insert({node->host, node->device, node->price_kind});
  }
  design.memory_devices = static_cast<int>(devices.size());
  if (design.memory_devices == 0) design.memory = nullptr;
  // More batches than compute nodes take turns on them, one's attention beside another's slices
  // (`rotational`, and `auto` on one compute node at the experiment's largest batch limits).
  design.pipelined = design.memory != nullptr &&
                     topology.BatchComputeNodes().size() > topology.NodesOf(NodeKind::kCompute).size();
  return design;
}

// The KV pool's dtype on the topology's first node holding KV caches (the planner models one for
// all).
absl::StatusOr<DType> KvDtypeOf(const Topology& topology, const ModelConfig& config) {
  const NodeSpec* pool = topology.KvNodes().front();
  return ChooseKvDtype(pool->kv_dtype, config, pool->device != "cpu");
}

double MeanContext(const ExperimentSpec& spec, int64_t context) {
  return static_cast<double>(context - spec.output_tokens) + spec.output_tokens / 2.0;
}

}  // namespace

absl::StatusOr<std::string> PlannerSection(const ExperimentResult& result) {
  const ExperimentSpec& spec = result.spec;
  std::string md =
      "## Planner check\n\nThe analytic model (`lamina plan`) predicts each topology's output tokens/s per $/h from "
      "its devices' price-table figures and its KV capacity, at the largest batch limit of the experiment, with "
      "compute and attention overlapped where more batches than compute nodes take turns on them. It models one "
      "compute device: a topology of several is predicted as its first, priced as all of its devices. Its "
      "absolute figures are the table's devices, not this machine; the check is whether it ranks the topologies "
      "as the measurements do.\n\n| context | topology | predicted tok/s per $/h | measured tok/s per $/h | "
      "predicted rank | measured rank |\n|---|---|---|---|---|---|\n";
  const int64_t max_batch = *std::max_element(spec.batch_limits.begin(), spec.batch_limits.end());
  int agree = 0, compared = 0;
  for (int64_t context : spec.context_lengths) {
    struct Row {
      std::string name;
      double predicted = 0, measured = -1;
    };
    std::vector<Row> rows;
    for (const TopologyInfo& info : result.topologies) {
      LAMINA_ASSIGN_OR_RETURN(Topology topology, LoadTopology(info.entry.file));
      LAMINA_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(topology.model_dir));
      LAMINA_ASSIGN_OR_RETURN(planner::Design design, DesignOf(topology, result.prices));
      LAMINA_ASSIGN_OR_RETURN(const DType kv_dtype, KvDtypeOf(topology, config));
      planner::Prediction p = planner::PredictBest(planner::ShapeOf(config, kv_dtype), MeanContext(spec, context),
                                                   design, planner::Efficiency{}, max_batch, 0);
      // The topology's own price overrides apply to the prediction too.
      p.tokens_per_s_per_usd_hour = info.cost.hourly_usd > 0 ? p.tokens_per_s / info.cost.hourly_usd : 0;
      Row row{info.entry.name, p.infeasible.empty() ? p.tokens_per_s_per_usd_hour : 0, -1};
      if (const RunResult* best = BestPerDollar(result, info.entry.name, context)) {
        row.measured = best->bench.tokens_per_s_per_usd_hour;
      }
      rows.push_back(row);
    }
    auto rank = [&](double Row::*field, const Row& row) {
      int r = 1;
      for (const Row& other : rows) r += (other.*field) > (row.*field);
      return r;
    };
    bool same = true;
    for (const Row& row : rows) {
      const int predicted = rank(&Row::predicted, row), measured = rank(&Row::measured, row);
      same &= predicted == measured;
      absl::StrAppendFormat(&md, "| %d | %s | %.1f | %s | %d | %d |\n", context, row.name, row.predicted,
                            row.measured < 0 ? "-" : absl::StrFormat("%.1f", row.measured), predicted, measured);
    }
    ++compared;
    agree += same;
  }
  absl::StrAppendFormat(&md, "\nThe predicted ranking matches the measured one at %d of %d context lengths.\n", agree,
                        compared);
  return md;
}

absl::StatusOr<std::string> SimulatorSection(const ExperimentResult& result, const std::string& out_dir) {
  const ExperimentSpec& spec = result.spec;
  std::string md =
      "## Simulator check\n\nPer-operation costs are fitted from each topology's runs (iteration time against "
      "decoded sequences, attended tokens and prefilled tokens; the coordinator's serial work per iteration) and "
      "written as `costs-TOPOLOGY.yaml`; then every run is simulated with the same batch limit and workload. The "
      "error is simulated ÷ measured output tokens/s − 1.\n\n| topology | batch limit | context | measured tok/s | "
      "simulated tok/s | error | fit: iteration ms measured / fitted |\n|---|---|---|---|---|---|---|\n";
  double abs_error = 0;
  int simulated = 0;
  std::string largest;
  int largest_nodes = 0;
  for (const TopologyInfo& info : result.topologies) {
    LAMINA_ASSIGN_OR_RETURN(Topology topology, LoadTopology(info.entry.file));
    LAMINA_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(topology.model_dir));
    // Its batches in flight, each iterating on its own: a run's iterations per second count them
    // all, its mean batch and iteration time are a batch's.
    const int batches = static_cast<int>(topology.BatchComputeNodes().size());
    std::vector<simulator::CalibrationPoint> points;
    std::vector<const RunResult*> runs;
    for (const RunResult& r : result.runs) {
      if (r.topology != info.entry.name || !r.status.ok() || r.bench.iterations_per_s <= 0) continue;
      points.push_back({r.bench.mean_batch, MeanContext(spec, r.context), r.bench.prefill_tokens_per_iteration,
                        r.bench.iteration_ms, batches * 1e3 / r.bench.iterations_per_s});
      runs.push_back(&r);
    }
    const int64_t per_node = info.memory_nodes > 0 ? info.kv_capacity_tokens / info.memory_nodes : 0;
    absl::StatusOr<simulator::CostModel> costs = simulator::FitCostModel(
        points, info.memory_nodes, per_node, absl::StrCat("the ", info.entry.name, " runs of experiment ", spec.name));
    if (!costs.ok()) {
      absl::StrAppend(&md, "| ", info.entry.name, " | - | - | - | - | not fitted: ", costs.status().message(), " | |\n");
      continue;
    }
    costs->max_tokens_per_iteration = topology.max_tokens_per_iteration;
    costs->chunked_prefill = topology.chunked_prefill;
    costs->batches = batches;
    if (topology.SecondBatchOnDemand()) costs->more_batches_above = topology.rotational_above;
    {
      const std::string path = absl::StrCat(out_dir, "/costs-", info.entry.name, ".yaml");
      std::ofstream out(path);
      out << simulator::CostModelToYaml(*costs);
      if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
    }
    if (info.compute_nodes + info.memory_nodes > largest_nodes) {
      largest_nodes = info.compute_nodes + info.memory_nodes;
      largest = info.entry.name;
    }
    for (size_t i = 0; i < runs.size(); ++i) {
      const RunResult& r = *runs[i];
      bench::WorkloadSpec workload;
      workload.concurrency = static_cast<int>(r.batch_limit);
      workload.requests = r.bench.requests;
      workload.prompt_tokens = static_cast<int>(r.context - spec.output_tokens);
      workload.output_tokens = static_cast<int>(spec.output_tokens);
      workload.seed = static_cast<uint64_t>(r.context);
      LAMINA_ASSIGN_OR_RETURN(std::vector<bench::BenchRequest> requests,
                              bench::MakeRequests(workload, static_cast<int>(config.vocab_size),
                                                  static_cast<int>(config.max_position_embeddings)));
      const simulator::SimulationResult sim =
          simulator::Simulate(*costs, {1, std::max(1, info.memory_nodes), r.batch_limit}, workload, requests);
      const double error = sim.output_tokens_per_s / r.bench.output_tokens_per_s - 1;
      abs_error += std::fabs(error);
      ++simulated;
      absl::StrAppendFormat(&md, "| %s | %d | %d | %.1f | %.1f | %+.0f%% | %.2f / %.2f |\n", r.topology, r.batch_limit,
                            r.context, r.bench.output_tokens_per_s, sim.output_tokens_per_s, 100 * error,
                            points[i].iteration_ms, simulator::PredictIterationMs(*costs, points[i]));
    }
  }
  if (simulated > 0) {
    absl::StrAppendFormat(&md,
                          "\nMean absolute error over %d runs: %.1f%%. The largest cluster run here is `%s` (%d "
                          "nodes); `lamina simulate --costs %s/costs-%s.yaml` extrapolates it to more nodes.\n",
                          simulated, 100 * abs_error / simulated, largest, largest_nodes, out_dir, largest);
  }
  return md;
}

}  // namespace lamina::experiment
