#include "deploy/bench/bench_report.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lamina::bench {

Percentiles Summarize(std::vector<double> values) {
  Percentiles p;
  if (values.empty()) return p;
  std::sort(values.begin(), values.end());
  auto rank = [&](double q) {
    const size_t index = static_cast<size_t>(std::ceil(q * values.size()));
    return values[std::min(values.size(), std::max<size_t>(index, 1)) - 1];
  };
  p.p50 = rank(0.50);
  p.p90 = rank(0.90);
  p.p99 = rank(0.99);
  double sum = 0;
  for (double v : values) sum += v;
  p.mean = sum / values.size();
  return p;
}

BenchReport MakeReport(const WorkloadSpec& spec, const std::vector<RequestRecord>& records,
                       const lamina::v1::ClusterStatusResponse& before, const lamina::v1::ClusterStatusResponse& after,
                       const std::vector<lamina::v1::ClusterStatusResponse>& samples, double hourly_usd) {
  BenchReport r;
  r.requests = static_cast<int>(records.size());
  r.ttft_target_ms = spec.ttft_target_ms;
  r.tpot_target_ms = spec.tpot_target_ms;
  double first_sent = 1e300, last_done = 0;
  std::vector<double> ttft, tpot, latency;
  int64_t good_tokens = 0;
  for (const RequestRecord& rec : records) {
    first_sent = std::min(first_sent, rec.sent_s);
    last_done = std::max(last_done, rec.done_s);
    if (!rec.status.ok()) {
      if (r.failed++ == 0) r.first_error = std::string(rec.status.message());
      continue;
    }
    r.input_tokens += rec.prompt_tokens;
    r.output_tokens += rec.output_tokens;
    const double first_ms = 1e3 * (rec.first_token_s - rec.sent_s);
    const double total_ms = 1e3 * (rec.done_s - rec.sent_s);
    const double per_token_ms = rec.output_tokens > 1 ? (total_ms - first_ms) / (rec.output_tokens - 1) : 0;
    ttft.push_back(first_ms);
    latency.push_back(total_ms);
    if (rec.output_tokens > 1) tpot.push_back(per_token_ms);
    const bool ttft_ok = spec.ttft_target_ms <= 0 || first_ms <= spec.ttft_target_ms;
    const bool tpot_ok = spec.tpot_target_ms <= 0 || per_token_ms <= spec.tpot_target_ms;
    if (ttft_ok && tpot_ok) {
      ++r.met_targets;
      good_tokens += rec.output_tokens;
    }
  }
  r.wall_s = records.empty() ? 0 : std::max(1e-9, last_done - first_sent);
  if (r.wall_s > 0) {
    r.input_tokens_per_s = r.input_tokens / r.wall_s;
    r.output_tokens_per_s = r.output_tokens / r.wall_s;
    r.goodput_requests_per_s = r.met_targets / r.wall_s;
    r.goodput_tokens_per_s = good_tokens / r.wall_s;
  }
  r.ttft_ms = Summarize(ttft);
  r.tpot_ms = Summarize(tpot);
  r.latency_ms = Summarize(latency);

  const int64_t iterations = after.iterations() - before.iterations();
  if (iterations > 0) {
    r.mean_batch = static_cast<double>(after.decoded_sequences() - before.decoded_sequences()) / iterations;
    if (r.wall_s > 0) r.iterations_per_s = iterations / r.wall_s;
    r.iteration_ms = 1e3 * (after.iteration_seconds() - before.iteration_seconds()) / iterations;
    r.prefill_tokens_per_iteration =
        static_cast<double>(after.prefilled_tokens() - before.prefilled_tokens()) / iterations;
  }

  std::map<std::string, const lamina::v1::NodeStatus*> earlier;
  for (const auto& n : before.nodes()) earlier[n.name()] = &n;
  double trip_seconds = 0;
  int64_t trips = 0;
  for (const auto& n : after.nodes()) {
    NodeFigures f;
    f.name = n.name();
    f.memory = n.role() == lamina::v1::NODE_ROLE_MEMORY;
    f.holds_kv = n.kv_capacity_slots() > 0;
    auto it = earlier.find(n.name());
    if (it != earlier.end()) {
      const auto& a = it->second->load();
      const auto& b = n.load();
      const double clock = b.clock_seconds() - a.clock_seconds();
      if (clock > 0) f.busy_fraction = std::clamp((b.busy_seconds() - a.busy_seconds()) / clock, 0.0, 1.0);
      trip_seconds += b.round_trip_seconds() - a.round_trip_seconds();
      trips += b.round_trips() - a.round_trips();
      if (!f.memory && b.busy_count() > a.busy_count()) {
        r.compute_ms_per_iteration = 1e3 * (b.busy_seconds() - a.busy_seconds()) / (b.busy_count() - a.busy_count());
      }
    }
    if (f.holds_kv) {
      int count = 0;
      for (const auto& sample : samples) {
        for (const auto& s : sample.nodes()) {
          if (s.name() != n.name() || s.kv_capacity_slots() <= 0) continue;
          const double used = static_cast<double>(s.kv_used_slots()) / s.kv_capacity_slots();
          f.kv_occupancy_mean += used;
          f.kv_occupancy_peak = std::max(f.kv_occupancy_peak, used);
          ++count;
        }
      }
      if (count > 0) f.kv_occupancy_mean /= count;
    }
    r.nodes.push_back(f);
  }
  if (trips > 0) r.round_trip_us = 1e6 * trip_seconds / trips;
  r.hourly_usd = hourly_usd;
  if (hourly_usd > 0) r.tokens_per_s_per_usd_hour = r.output_tokens_per_s / hourly_usd;
  return r;
}

std::string FormatReport(const BenchReport& r) {
  std::string out;
  absl::StrAppendFormat(&out, "requests     %d sent, %d failed%s%s\n", r.requests, r.failed,
                        r.failed > 0 ? " (first: " : "", r.failed > 0 ? r.first_error + ")" : "");
  absl::StrAppendFormat(&out, "duration     %.2f s\n", r.wall_s);
  absl::StrAppendFormat(&out, "throughput   %.1f tokens/s in, %.1f tokens/s out (%lld in, %lld out)\n",
                        r.input_tokens_per_s, r.output_tokens_per_s, static_cast<long long>(r.input_tokens),
                        static_cast<long long>(r.output_tokens));
  absl::StrAppendFormat(&out, "%-12s %10s %10s %10s %10s\n", "latency (ms)", "p50", "p90", "p99", "mean");
  auto row = [&](const char* name, const Percentiles& p) {
    absl::StrAppendFormat(&out, "%-12s %10.1f %10.1f %10.1f %10.1f\n", name, p.p50, p.p90, p.p99, p.mean);
  };
  row("  TTFT", r.ttft_ms);
  row("  TPOT", r.tpot_ms);
  row("  request", r.latency_ms);
  std::string targets = "no latency targets";
  if (r.ttft_target_ms > 0 || r.tpot_target_ms > 0) {
    targets = absl::StrFormat("%d of %d requests met TTFT <= %s and TPOT <= %s", r.met_targets, r.requests,
                              r.ttft_target_ms > 0 ? absl::StrFormat("%.0f ms", r.ttft_target_ms) : "any",
                              r.tpot_target_ms > 0 ? absl::StrFormat("%.0f ms", r.tpot_target_ms) : "any");
  }
  absl::StrAppendFormat(&out, "goodput      %.2f requests/s, %.1f tokens/s (%s)\n", r.goodput_requests_per_s,
                        r.goodput_tokens_per_s, targets);
  absl::StrAppendFormat(&out, "iterations   %.1f/s, mean decode batch %.1f", r.iterations_per_s, r.mean_batch);
  if (r.round_trip_us > 0) absl::StrAppendFormat(&out, ", per-layer round trip %.0f us", r.round_trip_us);
  out += "\n";
  if (r.hourly_usd > 0) {
    absl::StrAppendFormat(&out, "cost         $%.2f/h: %.1f output tokens/s per $/h\n", r.hourly_usd,
                          r.tokens_per_s_per_usd_hour);
  }
  absl::StrAppendFormat(&out, "%-14s %-8s %6s %14s\n", "node", "role", "busy", "KV mean/peak");
  for (const NodeFigures& n : r.nodes) {
    const std::string kv =
        n.holds_kv ? absl::StrFormat("%.0f%% / %.0f%%", 100 * n.kv_occupancy_mean, 100 * n.kv_occupancy_peak) : "-";
    absl::StrAppendFormat(&out, "%-14s %-8s %5.0f%% %14s\n", n.name, n.memory ? "memory" : "compute",
                          100 * n.busy_fraction, kv);
  }
  return out;
}

nlohmann::json ReportToJson(const BenchReport& r) {
  auto percentiles = [](const Percentiles& p) {
    return nlohmann::json{{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"mean", p.mean}};
  };
  nlohmann::json nodes = nlohmann::json::array();
  for (const NodeFigures& n : r.nodes) {
    nlohmann::json node{{"name", n.name}, {"role", n.memory ? "memory" : "compute"}, {"busy_fraction", n.busy_fraction}};
    if (n.holds_kv) {
      node["kv_occupancy_mean"] = n.kv_occupancy_mean;
      node["kv_occupancy_peak"] = n.kv_occupancy_peak;
    }
    nodes.push_back(node);
  }
  return nlohmann::json{
      {"requests", r.requests},
      {"failed", r.failed},
      {"first_error", r.first_error},
      {"wall_s", r.wall_s},
      {"input_tokens", r.input_tokens},
      {"output_tokens", r.output_tokens},
      {"input_tokens_per_s", r.input_tokens_per_s},
      {"output_tokens_per_s", r.output_tokens_per_s},
      {"ttft_ms", percentiles(r.ttft_ms)},
      {"tpot_ms", percentiles(r.tpot_ms)},
      {"latency_ms", percentiles(r.latency_ms)},
      {"ttft_target_ms", r.ttft_target_ms},
      {"tpot_target_ms", r.tpot_target_ms},
      {"met_targets", r.met_targets},
      {"goodput_requests_per_s", r.goodput_requests_per_s},
      {"goodput_tokens_per_s", r.goodput_tokens_per_s},
      {"mean_batch", r.mean_batch},
      {"iterations_per_s", r.iterations_per_s},
      {"round_trip_us", r.round_trip_us},
      {"iteration_ms", r.iteration_ms},
      {"compute_ms_per_iteration", r.compute_ms_per_iteration},
      {"prefill_tokens_per_iteration", r.prefill_tokens_per_iteration},
      {"hourly_usd", r.hourly_usd},
      {"tokens_per_s_per_usd_hour", r.tokens_per_s_per_usd_hour},
      {"nodes", nodes},
  };
}

}  // namespace lamina::bench
