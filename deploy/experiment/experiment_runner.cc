#include "deploy/experiment/experiment_runner.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status/status_macros.h"
#include "common/topology/relocated_topology.h"
#include "common/topology/topology.h"
#include "common/yaml/yaml_fields.h"
#include "deploy/bench/bench_runner.h"
#include "deploy/experiment/cluster_launcher.h"

namespace lamina::experiment {
namespace {

// First use costs on a fresh cluster (CUDA modules, GEMM plans, first allocations) would land in
// the first run: a full batch of short requests goes first, unmeasured. A failure here shows up
// again in the runs, which say what it is.
void WarmUp(cli::ClusterClient& client, int64_t batch, double request_timeout_s, bool show_progress) {
  bench::WorkloadSpec warm_up;
  warm_up.mode = bench::ArrivalMode::kClosedLoop;
  warm_up.concurrency = static_cast<int>(batch);
  warm_up.requests = static_cast<int>(batch);
  warm_up.prompt_tokens = 32;
  warm_up.output_tokens = 4;
  warm_up.request_timeout_s = request_timeout_s;
  bench::GrpcSender sender(&client);
  absl::StatusOr<bench::BenchReport> report =
      bench::RunBench({&sender, &client}, warm_up, {0.0, /*show_progress=*/false, "warm-up"});
  if (!show_progress) return;
  if (!report.ok()) {
    std::fprintf(stderr, "warm-up: %s\n", std::string(report.status().message()).c_str());
  } else if (report->failed > 0) {
    std::fprintf(stderr, "warm-up: %d of %d requests failed (first: %s)\n", report->failed, report->requests,
                 report->first_error.c_str());
  }
}

// The topology of one run: the original with an absolute model path and max_batch set.
absl::StatusOr<std::string> WriteRunTopology(const Topology& topology, int64_t batch_limit, const std::string& path) {
  LAMINA_ASSIGN_OR_RETURN(YAML::Node root, RelocatableYaml(topology));
  root["scheduler"]["max_batch"] = batch_limit;
  std::ofstream out(path);
  out << "# Written by lamina experiment from " << topology.path << "\n" << YAML::Dump(root) << "\n";
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  return path;
}

void Summarize(RunResult* run) {
  int compute = 0, memory = 0;
  for (const bench::NodeFigures& n : run->bench.nodes) {
    if (n.memory) {
      run->memory_busy += n.busy_fraction;
      run->kv_peak = std::max(run->kv_peak, n.kv_occupancy_peak);
      ++memory;
    } else {
      run->compute_busy += n.busy_fraction;
      ++compute;
    }
  }
  if (compute > 0) run->compute_busy /= compute;
  if (memory > 0) run->memory_busy /= memory;
}

}  // namespace

absl::StatusOr<ExperimentResult> RunExperiment(const ExperimentSpec& spec, const ExperimentOptions& options) {
  ExperimentResult result;
  result.spec = spec;
  const std::string prices = spec.prices.empty() ? DefaultPriceTablePath() : spec.prices;
  if (prices.empty()) return absl::NotFoundError("no price table: set `prices:` in the experiment");
  LAMINA_ASSIGN_OR_RETURN(result.prices, LoadPriceTable(prices));
  std::vector<Topology> topologies;
  for (const TopologyEntry& entry : spec.topologies) {
    LAMINA_ASSIGN_OR_RETURN(Topology topology, LoadTopology(entry.file));
    TopologyInfo info;
    info.entry = entry;
    info.model_name = std::filesystem::path(topology.model_dir).filename().string();
    for (const NodeSpec& node : topology.nodes) {
      (node.kind == NodeKind::kCompute ? info.compute_nodes : info.memory_nodes)++;
      info.kv_capacity_tokens += node.kv_capacity_tokens;
    }
    LAMINA_ASSIGN_OR_RETURN(info.cost, PriceTopology(topology, result.prices));
    result.topologies.push_back(info);
    topologies.push_back(std::move(topology));
  }
  std::filesystem::create_directories(std::filesystem::path(options.out_dir) / "runs");

  const size_t total = spec.topologies.size() * spec.batch_limits.size() * spec.context_lengths.size();
  size_t done = 0;
  for (size_t t = 0; t < topologies.size(); ++t) {
    const TopologyInfo& info = result.topologies[t];
    for (int64_t batch : spec.batch_limits) {
      const std::string stem = absl::StrCat(info.entry.name, "-b", batch);
      const std::string run_dir = (std::filesystem::path(options.out_dir) / "runs").string();
      absl::StatusOr<std::unique_ptr<LaunchedCluster>> cluster;
      absl::StatusOr<std::string> file = WriteRunTopology(topologies[t], batch, absl::StrCat(run_dir, "/", stem, ".yaml"));
      if (!file.ok()) {
        cluster = file.status();
      } else {
        cluster = LaunchedCluster::Launch(options.lamina_binary, *file, absl::StrCat(run_dir, "/", stem, ".log"),
                                          absl::Seconds(spec.startup_timeout_s));
      }
      absl::StatusOr<std::unique_ptr<cli::ClusterClient>> client =
          cluster.ok() ? (*cluster)->Connect() : absl::StatusOr<std::unique_ptr<cli::ClusterClient>>(cluster.status());
      if (client.ok()) WarmUp(**client, batch, spec.request_timeout_s, options.show_progress);
      for (int64_t context : spec.context_lengths) {
        RunResult run;
        run.topology = info.entry.name;
        run.baseline = info.entry.baseline;
        run.batch_limit = batch;
        run.context = context;
        run.hourly_usd = info.cost.hourly_usd;
        ++done;
        const std::string label = absl::StrFormat("[%d/%d] %s, batch %d, context %d", done, total, info.entry.name,
                                                  batch, context);
        if (!client.ok()) {
          run.status = client.status();
        } else {
          bench::WorkloadSpec workload;
          workload.mode = bench::ArrivalMode::kClosedLoop;
          workload.concurrency = static_cast<int>(batch);
          workload.requests = static_cast<int>(std::max(spec.min_requests, spec.requests_per_batch * batch));
          workload.output_tokens = static_cast<int>(spec.output_tokens);
          workload.prompt_tokens = static_cast<int>(context - spec.output_tokens);
          workload.seed = static_cast<uint64_t>(context);
          workload.request_timeout_s = spec.request_timeout_s;
          bench::GrpcSender sender(client->get());
          absl::StatusOr<bench::BenchReport> report = bench::RunBench(
              {&sender, client->get()}, workload, {info.cost.hourly_usd, options.show_progress, label});
          if (!report.ok()) {
            run.status = report.status();
          } else {
            run.bench = *std::move(report);
            if (run.bench.failed == run.bench.requests) {
              run.status = absl::UnavailableError(absl::StrCat("every request failed: ", run.bench.first_error));
            }
            Summarize(&run);
          }
        }
        if (options.show_progress) {
          if (run.status.ok()) {
            std::fprintf(stderr, "%s: %.1f tokens/s, %.1f tokens/s per $/h%s\n", label.c_str(),
                         run.bench.output_tokens_per_s, run.bench.tokens_per_s_per_usd_hour,
                         run.bench.failed > 0 ? absl::StrCat(", ", run.bench.failed, " requests failed").c_str() : "");
          } else {
            std::fprintf(stderr, "%s: FAILED: %s\n", label.c_str(), std::string(run.status.message()).c_str());
          }
        }
        result.runs.push_back(std::move(run));
      }
    }
  }
  return result;
}

}  // namespace lamina::experiment
