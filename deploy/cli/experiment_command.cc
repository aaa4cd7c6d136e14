#include "deploy/cli/experiment_command.h"

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/flags/flags.h"
#include "common/status/status_macros.h"
#include "deploy/experiment/experiment_checks.h"
#include "deploy/experiment/experiment_report.h"
#include "deploy/experiment/experiment_runner.h"
#include "deploy/experiment/experiment_spec.h"

namespace lamina::cli {

const char kExperimentUsage[] =
    "usage: lamina experiment SPEC.yaml [--out DIR] [--quiet]\n"
    "  Runs every topology x batch limit x context length of the spec (schema: deploy/EXPERIMENTS.md),\n"
    "  starting and stopping the clusters itself, and writes DIR/report.md, DIR/results.csv and SVG\n"
    "  plots (default DIR: ./NAME-report).\n";

namespace {

absl::Status Experiment(const std::vector<std::string>& args) {
  if (args.empty() || args[0].rfind("--", 0) == 0) return absl::InvalidArgumentError("the spec file is required");
  LAMINA_ASSIGN_OR_RETURN(Flags flags, Flags::Parse({args.begin() + 1, args.end()}, {"out"}, {"quiet"}));
  LAMINA_ASSIGN_OR_RETURN(experiment::ExperimentSpec spec, experiment::LoadExperimentSpec(args[0]));
  const std::string out_dir = flags.String("out", spec.name + "-report");
  experiment::ExperimentOptions options;
  options.lamina_binary = std::filesystem::read_symlink("/proc/self/exe").string();
  options.out_dir = out_dir;
  options.show_progress = !flags.Has("quiet");
  LAMINA_ASSIGN_OR_RETURN(experiment::ExperimentResult result, experiment::RunExperiment(spec, options));
  LAMINA_ASSIGN_OR_RETURN(std::string planner_check, experiment::PlannerSection(result));
  LAMINA_ASSIGN_OR_RETURN(std::string simulator_check, experiment::SimulatorSection(result, out_dir));
  LAMINA_RETURN_IF_ERROR(experiment::WriteReport(result, out_dir, {planner_check, simulator_check}));

  int failed = 0;
  for (const auto& run : result.runs) failed += !run.status.ok();
  std::printf("%zu runs (%d failed); best output tokens/s per $/h:\n", result.runs.size(), failed);
  for (int64_t context : spec.context_lengths) {
    std::printf("  context %lld:", static_cast<long long>(context));
    for (const auto& t : result.topologies) {
      const experiment::RunResult* best = experiment::BestPerDollar(result, t.entry.name, context);
      if (best) {
        std::printf("  %s %.1f (batch %lld)", t.entry.name.c_str(), best->bench.tokens_per_s_per_usd_hour,
                    static_cast<long long>(best->batch_limit));
      } else {
        std::printf("  %s -", t.entry.name.c_str());
      }
    }
    std::printf("\n");
  }
  std::printf("report: %s/report.md\n", out_dir.c_str());
  return failed == static_cast<int>(result.runs.size()) ? absl::UnavailableError("every run failed") : absl::OkStatus();
}

}  // namespace

int RunExperimentCommand(const std::vector<std::string>& args) {
  absl::Status status = Experiment(args);
  if (status.ok()) return 0;
  std::fprintf(stderr, "lamina experiment: %s\n", std::string(status.message()).c_str());
  return absl::IsInvalidArgument(status) ? 2 : 1;
}

}  // namespace lamina::cli
