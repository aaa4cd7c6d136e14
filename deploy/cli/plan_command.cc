#include "deploy/cli/plan_command.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags/flags.h"
#include "common/model_config/model_config.h"
#include "common/status/status_macros.h"
#include "common/topology/kv_dtype.h"
#include "deploy/cost/price_table.h"
#include "deploy/planner/planner.h"

namespace lamina::cli {

const char kPlanUsage[] =
    "usage: lamina plan --model DIR --workload FILE [--prices FILE] [--compute KINDS] [--memory KINDS]\n"
    "                   [--pipelining none|rotational] [--kv-dtype bfloat16|float8_e4m3] [--max-batch N] [--top N]\n"
    "  Ranks topologies for a model and workload by predicted output tokens/s per $/h, from the\n"
    "  paper's analytic model and the price table (default deploy/prices/devices.yaml). KINDS is a\n"
    "  comma-separated list of price-table kinds; the workload's tpot_target_ms caps the batch. --kv-dtype\n"
    "  is the memory nodes' KV pool (topology `kv_dtype`, default bfloat16): float8_e4m3 holds about\n"
    "  twice the tokens and attention reads about half the bytes.\n";

namespace {

// The `balanced` column, 9 characters wide: "-" when colocated.
std::string BalancedColumn(const planner::Prediction& p) {
  std::string text = p.design.memory == nullptr            ? "-"
                     : p.balanced_memory_devices == 0 ? "none"
                                                      : std::to_string(p.balanced_memory_devices);
  if (text.size() < 9) text.insert(0, 9 - text.size(), ' ');
  return text;
}

absl::Status Plan(const std::vector<std::string>& args) {
  LAMINA_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(args,
                                                    {"model", "workload", "prices", "compute", "memory", "pipelining",
                                                     "kv-dtype", "max-batch", "top"},
                                                    {}));
  if (!flags.Has("model") || !flags.Has("workload")) {
    return absl::InvalidArgumentError("--model DIR and --workload FILE are required");
  }
  LAMINA_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(flags.String("model", "")));
  LAMINA_ASSIGN_OR_RETURN(bench::WorkloadSpec workload, bench::LoadWorkload(flags.String("workload", "")));
  const std::string prices = flags.String("prices", DefaultPriceTablePath());
  if (prices.empty()) return absl::InvalidArgumentError("--prices FILE is required (no shipped price table found)");
  LAMINA_ASSIGN_OR_RETURN(PriceTable table, LoadPriceTable(prices));
  planner::PlanOptions options;
  for (const char* flag : {"compute", "memory"}) {
    for (absl::string_view kind : absl::StrSplit(flags.String(flag, ""), ',', absl::SkipEmpty())) {
      LAMINA_RETURN_IF_ERROR(table.Find(std::string(kind)).status());
      (std::string(flag) == "compute" ? options.compute_kinds : options.memory_kinds).insert(std::string(kind));
    }
  }
  const std::string pipelining = flags.String("pipelining", "none");
  if (pipelining != "none" && pipelining != "rotational") {
    return absl::InvalidArgumentError("--pipelining: expected 'none' or 'rotational'");
  }
  options.pipelined = pipelining == "rotational";
  const std::string kv_dtype_name = flags.String("kv-dtype", "bfloat16");
  if (kv_dtype_name != "bfloat16" && kv_dtype_name != "float8_e4m3") {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-dtype: expected 'bfloat16' or 'float8_e4m3', got '", kv_dtype_name, "'"));
  }
  const DType kv_dtype = kv_dtype_name == "bfloat16" ? DType::kBF16 : DType::kF8E4M3;
  LAMINA_ASSIGN_OR_RETURN(options.max_batch, flags.Int("max-batch", options.max_batch));
  LAMINA_ASSIGN_OR_RETURN(int64_t top, flags.Int("top", 10));
  options.tpot_target_s = workload.tpot_target_ms / 1e3;
  double prompt = 0, output = 0;
  LAMINA_RETURN_IF_ERROR(planner::MeanLengths(workload, &prompt, &output));
  const double context = planner::MeanDecodeContext(prompt, output);
  const planner::ModelShape model = planner::ShapeOf(config, kv_dtype);

  std::printf("model %s: %.2fB parameters (%.1f GB in bf16), %.1f KB of KV per token in %s\n",
              flags.String("model", "").c_str(), model.params / 1e9, model.weight_bytes() / 1e9,
              model.kv_bytes_per_token() / 1e3, KvDtypeName(kv_dtype));
  std::printf("workload: prompt %.0f, output %.0f tokens (mean decode context %.0f)%s; pipelining %s\n", prompt, output,
              context,
              workload.tpot_target_ms > 0 ? ("; time per token <= " + std::to_string(static_cast<int>(workload.tpot_target_ms)) + " ms").c_str() : "",
              pipelining.c_str());
  std::printf("prices: %s\n\n", table.path.c_str());
  std::printf("%4s  %-44s %7s %10s %8s %14s %8s %5s %9s %s %s\n", "rank", "design", "batch", "tokens/s", "$/h",
              "tok/s per $/h", "TPOT ms", "MFU", "link GB/s", options.pipelined ? " balanced" : "", "bottleneck");
  int rank = 0;
  for (const planner::Prediction& p : planner::Plan(model, context, table, options)) {
    if (!p.infeasible.empty()) continue;
    if (++rank > top) break;
    std::printf("%4d  %-44s %7lld %10.0f %8.2f %14.1f %8.1f %4.0f%% %9s %s %s\n", rank, p.design.Name().c_str(),
                static_cast<long long>(p.batch), p.tokens_per_s, p.hourly_usd, p.tokens_per_s_per_usd_hour,
                1e3 * p.step_s, 100 * p.mfu,
                p.design.memory ? std::to_string(std::lround(p.needed_link_gbs)).c_str() : "-",
                options.pipelined ? BalancedColumn(p).c_str() : "", p.bottleneck.c_str());
  }
  if (rank == 0) std::printf("no design fits this model and workload\n");
  if (rank > 0 && options.pipelined) {
    std::printf("\nbalanced: the paper's sizing, the fewest memory devices whose attention and link time fit\n"
                "within the compute time, so that each batch's attention hides behind the other batch's slices\n"
                "(\"none\": no count up to 64 does). The design column holds the count with the most tokens/s\n"
                "per $/h.\n");
  }
  return absl::OkStatus();
}

}  // namespace

int RunPlanCommand(const std::vector<std::string>& args) {
  absl::Status status = Plan(args);
  if (status.ok()) return 0;
  std::fprintf(stderr, "lamina plan: %s\n", std::string(status.message()).c_str());
  return absl::IsInvalidArgument(status) ? 2 : 1;
}

}  // namespace lamina::cli
