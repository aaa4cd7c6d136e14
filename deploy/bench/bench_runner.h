// One bench run against a running cluster: checks that it serves, makes the workload's requests
// for its model, reads the cluster's status before, during (every 250 ms, for KV occupancy) and
// after the run (once every node has reported past its end), and returns the report.
// Progress goes to stderr while it runs (a live line on a terminal, a line per quarter otherwise).
// Thread-compatible.
#ifndef LAMINA_DEPLOY_BENCH_BENCH_RUNNER_H_
#define LAMINA_DEPLOY_BENCH_BENCH_RUNNER_H_

#include <string>

#include "absl/status/statusor.h"
#include "deploy/bench/bench_report.h"
#include "deploy/bench/workload.h"
#include "deploy/cli/cluster_client.h"

namespace lamina::bench {

struct BenchOptions {
  double hourly_usd = 0;      // the cluster's price, for tokens/s per $/h; 0 = unpriced
  bool show_progress = true;
  std::string label;          // prefixes progress lines, e.g. "offloaded b=16 ctx=256"
};

// FailedPrecondition when the cluster is not serving; the requests' own failures are counted in
// the report, not returned.
absl::StatusOr<BenchReport> RunBench(cli::ClusterClient* client, const WorkloadSpec& spec, const BenchOptions& options);

}  // namespace lamina::bench

#endif  // LAMINA_DEPLOY_BENCH_BENCH_RUNNER_H_
