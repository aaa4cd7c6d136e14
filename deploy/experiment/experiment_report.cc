#include "deploy/experiment/experiment_report.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/cuda/device.h"
#include "deploy/report/svg_plot.h"

namespace lamina::experiment {
namespace {

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

std::string Csv(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  return absl::StrCat("\"", absl::StrReplaceAll(text, {{"\"", "\"\""}, {"\n", " "}}), "\"");
}

std::string ResultsCsv(const ExperimentResult& result) {
  std::string out =
      "topology,baseline,batch_limit,context,prompt_tokens,output_tokens,requests,failed,output_tokens_per_s,"
      "input_tokens_per_s,ttft_p50_ms,ttft_p99_ms,tpot_p50_ms,tpot_p99_ms,mean_batch,round_trip_us,compute_busy,"
      "memory_busy,kv_peak,hourly_usd,tokens_per_s_per_usd_hour,error\n";
  for (const RunResult& r : result.runs) {
    const bench::BenchReport& b = r.bench;
    absl::StrAppendFormat(&out, "%s,%d,%d,%d,%d,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.1f,%.4f,%.4f,%.4f,%.4f,%.4f,%s\n",
                          Csv(r.topology), r.baseline, r.batch_limit, r.context,
                          r.context - result.spec.output_tokens, result.spec.output_tokens, b.requests, b.failed,
                          b.output_tokens_per_s, b.input_tokens_per_s, b.ttft_ms.p50, b.ttft_ms.p99, b.tpot_ms.p50,
                          b.tpot_ms.p99, b.mean_batch, b.round_trip_us, r.compute_busy, r.memory_busy, r.kv_peak,
                          r.hourly_usd, b.tokens_per_s_per_usd_hour,
                          Csv(r.status.ok() ? "" : std::string(r.status.message())));
  }
  return out;
}

const TopologyInfo* Baseline(const ExperimentResult& result) {
  for (const TopologyInfo& t : result.topologies) {
    if (t.entry.baseline) return &t;
  }
  return nullptr;
}

std::string Machine() {
  char host[256] = "unknown";
  gethostname(host, sizeof(host) - 1);
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string model;
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::string machine = absl::StrCat(host, ", ", model.empty() ? "unknown CPU" : model, ", ",
                                     std::thread::hardware_concurrency(), " threads");
  const std::vector<std::string> gpus = GpuNames();
  if (!gpus.empty()) {
    const bool alike = std::all_of(gpus.begin(), gpus.end(), [&](const std::string& g) { return g == gpus[0]; });
    absl::StrAppend(&machine, ", ", alike ? absl::StrCat(gpus.size(), " x ", gpus[0]) : absl::StrJoin(gpus, ", "));
  }
  return machine;
}

}  // namespace

const RunResult* BestPerDollar(const ExperimentResult& result, const std::string& topology, int64_t context) {
  const RunResult* best = nullptr;
  for (const RunResult& r : result.runs) {
    if (r.topology != topology || r.context != context || !r.status.ok()) continue;
    if (best == nullptr || r.bench.tokens_per_s_per_usd_hour > best->bench.tokens_per_s_per_usd_hour) best = &r;
  }
  return best;
}

absl::Status WriteReport(const ExperimentResult& result, const std::string& out_dir,
                         const std::vector<std::string>& extra_sections) {
  const ExperimentSpec& spec = result.spec;
  std::filesystem::create_directories(out_dir);
  if (absl::Status s = WriteFile(out_dir + "/results.csv", ResultsCsv(result)); !s.ok()) return s;

  // Figure 12: throughput against the batch limit, one chart per context length.
  std::vector<std::string> batch_charts;
  for (int64_t context : spec.context_lengths) {
    report::LineChart chart;
    chart.title = absl::StrCat("Output throughput against batch limit, context ", context);
    chart.x_label = "batch limit (sequences)";
    chart.y_label = "output tokens/s";
    chart.log2_x = true;
    for (const TopologyInfo& t : result.topologies) {
      report::Series series{t.entry.name + (t.entry.baseline ? " (baseline)" : ""), {}, t.entry.baseline};
      for (const RunResult& r : result.runs) {
        if (r.topology == t.entry.name && r.context == context && r.status.ok()) {
          series.points.push_back({static_cast<double>(r.batch_limit), r.bench.output_tokens_per_s});
        }
      }
      chart.series.push_back(series);
    }
    const std::string name = absl::StrCat("throughput_vs_batch_ctx", context, ".svg");
    if (absl::Status s = WriteFile(out_dir + "/" + name, report::RenderSvg(chart)); !s.ok()) return s;
    batch_charts.push_back(name);
  }
  // Figure 13: the best throughput per dollar against the context length.
  report::LineChart per_dollar;
  per_dollar.title = "Best throughput per dollar against context length";
  per_dollar.x_label = "context (prompt + output tokens)";
  per_dollar.y_label = "output tokens/s per $/h";
  per_dollar.log2_x = true;
  for (const TopologyInfo& t : result.topologies) {
    report::Series series{t.entry.name + (t.entry.baseline ? " (baseline)" : ""), {}, t.entry.baseline};
    for (int64_t context : spec.context_lengths) {
      if (const RunResult* best = BestPerDollar(result, t.entry.name, context)) {
        series.points.push_back({static_cast<double>(context), best->bench.tokens_per_s_per_usd_hour});
      }
    }
    per_dollar.series.push_back(series);
  }
  if (absl::Status s = WriteFile(out_dir + "/per_dollar_vs_context.svg", report::RenderSvg(per_dollar)); !s.ok()) {
    return s;
  }

  std::string md = absl::StrCat("# Experiment: ", spec.name, "\n\n");
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  absl::StrAppend(&md, "- Spec: `", spec.path, "`; run ", date, " on ", Machine(), ".\n");
  absl::StrAppend(&md, "- Prices: `", result.prices.path, "` (and each topology's `prices:` overrides).\n");
  absl::StrAppendFormat(&md,
                        "- Each run: a closed loop with as many requests in flight as the batch limit, max(%d, %d x "
                        "batch limit) requests, random prompts of context - %d tokens, %d output tokens each.\n\n",
                        spec.min_requests, spec.requests_per_batch, spec.output_tokens, spec.output_tokens);
  md += "## Topologies\n\n| topology | model | compute nodes | memory nodes | KV slots | devices | $/h |\n|---|---|---|---|---|---|---|\n";
  for (const TopologyInfo& t : result.topologies) {
    std::string devices;
    for (const auto& line : t.cost.lines) {
      absl::StrAppendFormat(&devices, "%s%d x %s ($%.2f/h)", devices.empty() ? "" : " + ", line.devices, line.kind,
                            line.hourly_usd_each);
    }
    absl::StrAppendFormat(&md, "| %s%s | %s | %d | %d | %d | %s | %.2f |\n", t.entry.name,
                          t.entry.baseline ? " (baseline)" : "", t.model_name, t.compute_nodes, t.memory_nodes,
                          t.kv_capacity_tokens, devices, t.cost.hourly_usd);
  }
  md += "\n## Runs\n\n| topology | batch limit | context | out tok/s | TTFT p50 ms | TPOT p50 ms | mean batch | "
        "compute busy | memory busy | KV peak | $/h | tok/s per $/h |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const RunResult& r : result.runs) {
    if (!r.status.ok()) {
      absl::StrAppendFormat(&md, "| %s | %d | %d | failed: %s | | | | | | | | |\n", r.topology, r.batch_limit,
                            r.context, absl::StrReplaceAll(std::string(r.status.message()), {{"\n", " "}, {"|", "/"}}));
      continue;
    }
    const bench::BenchReport& b = r.bench;
    absl::StrAppendFormat(&md, "| %s | %d | %d | %.1f | %.1f | %.2f | %.1f | %.0f%% | %.0f%% | %.0f%% | %.2f | %.1f |\n",
                          r.topology, r.batch_limit, r.context, b.output_tokens_per_s, b.ttft_ms.p50, b.tpot_ms.p50,
                          b.mean_batch, 100 * r.compute_busy, 100 * r.memory_busy, 100 * r.kv_peak, r.hourly_usd,
                          b.tokens_per_s_per_usd_hour);
  }

  md += "\n## Throughput per dollar\n\nThe best run of each topology at each context (over the batch limits)";
  const TopologyInfo* baseline = Baseline(result);
  md += baseline ? absl::StrCat(", and its ratio to the baseline, ", baseline->entry.name, ".\n\n")
                 : " (no topology is marked as the baseline).\n\n";
  md += "| context | topology | best batch limit | tok/s per $/h | vs baseline |\n|---|---|---|---|---|\n";
  for (int64_t context : spec.context_lengths) {
    const RunResult* base = baseline ? BestPerDollar(result, baseline->entry.name, context) : nullptr;
    for (const TopologyInfo& t : result.topologies) {
      const RunResult* best = BestPerDollar(result, t.entry.name, context);
      if (best == nullptr) {
        absl::StrAppendFormat(&md, "| %d | %s | - | no successful run | - |\n", context, t.entry.name);
        continue;
      }
      const std::string ratio =
          base != nullptr && base->bench.tokens_per_s_per_usd_hour > 0
              ? absl::StrFormat("%.2fx", best->bench.tokens_per_s_per_usd_hour / base->bench.tokens_per_s_per_usd_hour)
              : "-";
      absl::StrAppendFormat(&md, "| %d | %s | %d | %.1f | %s |\n", context, t.entry.name, best->batch_limit,
                            best->bench.tokens_per_s_per_usd_hour, ratio);
    }
  }
  md += "\n## Plots\n\n";
  for (const std::string& chart : batch_charts) absl::StrAppend(&md, "![", chart, "](", chart, ")\n\n");
  md += "![per_dollar_vs_context.svg](per_dollar_vs_context.svg)\n";
  for (const std::string& section : extra_sections) absl::StrAppend(&md, "\n", section);
  return WriteFile(out_dir + "/report.md", md);
}

}  // namespace lamina::experiment
