// The figures of one bench run, from the requests' timings and the cluster's status read before,
// during and after it: tokens/s in and out, time to first token and time per output token
// (p50/p90/p99), goodput under the latency targets, per-node busy fraction, KV occupancy, the
// per-layer round trip, and, given a cost, tokens per second per dollar-hour.
// Plain values; thread-compatible.
#ifndef LAMINA_DEPLOY_BENCH_BENCH_REPORT_H_
#define LAMINA_DEPLOY_BENCH_BENCH_REPORT_H_

#include <string>
#include <vector>

#include "deploy/bench/load_generator.h"
#include "deploy/bench/workload.h"
#include "lamina/v1/cluster.pb.h"
#include "nlohmann/json.hpp"

namespace lamina::bench {

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
};
// Nearest-rank percentiles of `values` (all zero when empty).
Percentiles Summarize(std::vector<double> values);

struct NodeFigures {
  std::string name;
  bool memory = false;
  bool holds_kv = false;         // a memory node, or a compute node with a pool of its own
  double busy_fraction = 0;      // Δbusy ÷ Δclock over the run, on the node's clock
  double kv_occupancy_mean = 0;  // nodes holding KV: used ÷ capacity, sampled during the run
  double kv_occupancy_peak = 0;
};

struct BenchReport {
  int requests = 0;
  int failed = 0;
  std::string first_error;       // of the first failed request
  double wall_s = 0;             // first send to last finish
  int64_t input_tokens = 0;      // of the requests that succeeded
  int64_t output_tokens = 0;
  double input_tokens_per_s = 0;
  double output_tokens_per_s = 0;
  Percentiles ttft_ms;           // time to first token
  Percentiles tpot_ms;           // time per output token after the first
  Percentiles latency_ms;        // whole request
  double ttft_target_ms = 0, tpot_target_ms = 0;
  int met_targets = 0;           // succeeded within both targets
  double goodput_requests_per_s = 0;
  double goodput_tokens_per_s = 0;
  double mean_batch = 0;             // sequences decoded per iteration
  double iterations_per_s = 0;
  double round_trip_us = 0;          // mean per-layer attention round trip (0: none measured)
  // Per iteration, for the simulator's cost fit: the coordinator's wait on the compute node (plan
  // sent to result read), the compute nodes' own time, and the prompt tokens prefilled.
  double iteration_ms = 0;
  double compute_ms_per_iteration = 0;
  double prefill_tokens_per_iteration = 0;
  std::vector<NodeFigures> nodes;
  double hourly_usd = 0;             // 0 when not priced
  double tokens_per_s_per_usd_hour = 0;  // output tokens/s ÷ dollars per hour
};

// `samples` are status readings taken during the run (for KV occupancy).
BenchReport MakeReport(const WorkloadSpec& spec, const std::vector<RequestRecord>& records,
                       const lamina::v1::ClusterStatusResponse& before, const lamina::v1::ClusterStatusResponse& after,
                       const std::vector<lamina::v1::ClusterStatusResponse>& samples, double hourly_usd);

// A table for people.
std::string FormatReport(const BenchReport& report);
nlohmann::json ReportToJson(const BenchReport& report);

}  // namespace lamina::bench

#endif  // LAMINA_DEPLOY_BENCH_BENCH_REPORT_H_
