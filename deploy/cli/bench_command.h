// `lamina bench`: drives a running cluster through its public gRPC API with a workload and prints
// throughput, latency percentiles, goodput, per-node busy fraction, KV occupancy, the per-layer
// round trip and (for a priced topology) tokens/s per dollar-hour, as a table and optionally JSON.
#ifndef LAMINA_DEPLOY_CLI_BENCH_COMMAND_H_
#define LAMINA_DEPLOY_CLI_BENCH_COMMAND_H_

#include <string>
#include <vector>

namespace lamina::cli {

extern const char kBenchUsage[];
int RunBenchCommand(const std::vector<std::string>& args);

}  // namespace lamina::cli

#endif  // LAMINA_DEPLOY_CLI_BENCH_COMMAND_H_
