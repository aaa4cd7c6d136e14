// One bench run against a running server: checks that it serves, makes the workload's requests
// for its model, sends them (over gRPC, or OpenAI's HTTP API), and returns the report. With a
// Lamina cluster's gRPC endpoint it also reads the cluster's status before, during (every 250 ms,
// for KV occupancy) and after the run (once every node has reported past its end), for the
// figures only the cluster knows (each node's busy share, KV occupancy, the per-layer round trip);
// another server's report has the client's figures alone.
// Progress goes to stderr while it runs (a live line on a terminal, a line per quarter otherwise).
// Thread-compatible.
#ifndef LAMINA_DEPLOY_BENCH_BENCH_RUNNER_H_
#define LAMINA_DEPLOY_BENCH_BENCH_RUNNER_H_

#include <string>

#include "absl/status/statusor.h"
#include "deploy/bench/bench_report.h"
#include "deploy/bench/request_sender.h"
#include "deploy/bench/workload.h"
#include "deploy/client/cluster_client.h"

namespace lamina::bench {

struct BenchOptions {
  double hourly_usd = 0;      // the cluster's price, for tokens/s per $/h; 0 = unpriced
  bool show_progress = true;
  std::string label;          // prefixes progress lines, e.g. "offloaded b=16 ctx=256"
};

// Where the requests go, and what is known of the model.
struct BenchTarget {
  RequestSender* sender = nullptr;
  // A Lamina cluster's gRPC endpoint (its health, its model's shape and the status figures), or
  // null for a server that is not one.
  cli::ClusterClient* cluster = nullptr;
  // Without `cluster`: the model's vocabulary (random prompt ids are drawn below it) and context.
  int vocab_size = 0;
  int max_context = 0;
};

// FailedPrecondition when the cluster is not serving, or, without one, the vocabulary or context
// is unknown; the requests' own failures are counted in the report, not returned.
absl::StatusOr<BenchReport> RunBench(const BenchTarget& target, const WorkloadSpec& spec, const BenchOptions& options);

}  // namespace lamina::bench

#endif  // LAMINA_DEPLOY_BENCH_BENCH_RUNNER_H_
