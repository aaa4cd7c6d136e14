#include "deploy/planner/planner.h"

#include <algorithm>

#include "common/status/status_macros.h"

namespace lamina::planner {
namespace {

double MeanOf(const std::vector<bench::LengthBin>& bins) {
  double mean = 0;
  for (const bench::LengthBin& b : bins) mean += b.weight * (b.first + b.last) / 2.0;
  return mean;
}

}  // namespace

absl::Status MeanLengths(const bench::WorkloadSpec& workload, double* prompt_tokens, double* output_tokens) {
  if (!workload.prompts.empty()) {
    return absl::InvalidArgumentError("a prompts file's lengths are not known before tokenizing: give fixed lengths "
                                      "or a length distribution");
  }
  *prompt_tokens = workload.prompt_tokens;
  *output_tokens = workload.output_tokens;
  if (!workload.lengths.empty()) {
    LAMINA_ASSIGN_OR_RETURN(bench::LengthDistribution d, bench::LoadLengthDistribution(workload.lengths));
    *prompt_tokens = MeanOf(d.prompt_tokens);
    *output_tokens = MeanOf(d.output_tokens);
  }
  return absl::OkStatus();
}

std::vector<Prediction> Plan(const ModelShape& model, double context, const PriceTable& table,
                             const PlanOptions& options) {
  std::vector<Prediction> out;
  auto allowed = [](const std::set<std::string>& kinds, const std::string& name) {
    return kinds.empty() || kinds.count(name) != 0;
  };
  for (const auto& [compute_name, compute] : table.devices) {
    if (!allowed(options.compute_kinds, compute_name)) continue;
    // Weights larger than one device: the fewest that hold them, as a layer split.
    const int devices = std::max(1, ComputeDevicesFor(model, compute, options.efficiency));
    // Colocated, the group is tensor-parallel (its ranks' own pools hold the KV), of a size that
    // divides the model's heads and widths.
    Design colocated{&compute, nullptr, 0, false};
    colocated.compute_devices =
        devices == 1 ? 1 : std::max(devices, ComputeDevicesFor(model, compute, options.efficiency, 16, true));
    colocated.tensor_parallel = devices > 1;
    out.push_back(PredictBest(model, context, colocated, options.efficiency, options.max_batch, options.tpot_target_s));
    for (const auto& [memory_name, memory] : table.devices) {
      if (!allowed(options.memory_kinds, memory_name)) continue;
      const double alpha = compute.hourly_usd > 0 ? memory.hourly_usd / compute.hourly_usd : 1;
      const int n = BestMemoryDevices(model, context, compute, memory, alpha, options.efficiency, options.max_batch,
                                      options.tpot_target_s, options.pipelined, /*max_devices=*/64, devices);
      if (n == 0) continue;  // never feasible
      Design offloaded{&compute, &memory, n, options.pipelined};
      offloaded.compute_devices = devices;
      Prediction p = PredictBest(model, context, offloaded, options.efficiency, options.max_batch,
                                 options.tpot_target_s);
      if (options.pipelined) {
        p.balanced_memory_devices = BalancedMemoryDevices(model, context, compute, memory, options.efficiency,
                                                          options.max_batch, options.tpot_target_s, 64, devices);
      }
      out.push_back(p);
      if (devices == 1) continue;
      // The same devices as a tensor-parallel group, its ranks sending memory nodes their heads:
      // one batch, the all-reduces on the compute devices' link.
      const int group = colocated.compute_devices;
      const int m = BestMemoryDevices(model, context, compute, memory, alpha, options.efficiency, options.max_batch,
                                      options.tpot_target_s, /*pipelined=*/false, 64, group, /*tensor_parallel=*/true);
      if (m == 0) continue;
      Design tensor_parallel{&compute, &memory, m, false};
      tensor_parallel.compute_devices = group;
      tensor_parallel.tensor_parallel = true;
      out.push_back(PredictBest(model, context, tensor_parallel, options.efficiency, options.max_batch,
                                options.tpot_target_s));
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Prediction& a, const Prediction& b) {
    if (a.infeasible.empty() != b.infeasible.empty()) return a.infeasible.empty();
    return a.tokens_per_s_per_usd_hour > b.tokens_per_s_per_usd_hour;
  });
  return out;
}

}  // namespace lamina::planner
