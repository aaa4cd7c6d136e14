// `lamina simulate --costs FILE --workload FILE [--replicas R] [--memory-nodes M] [--max-batch B]`:
// predicts throughput, latency and utilisation of a cluster of R compute nodes with M memory nodes
// each, from per-operation costs measured on a real cluster (`lamina experiment` writes them), and
// names the bottleneck. Several --replicas values sweep the cluster size.
#ifndef LAMINA_DEPLOY_CLI_SIMULATE_COMMAND_H_
#define LAMINA_DEPLOY_CLI_SIMULATE_COMMAND_H_

#include <string>
#include <vector>

namespace lamina::cli {

extern const char kSimulateUsage[];
int RunSimulateCommand(const std::vector<std::string>& args);

}  // namespace lamina::cli

#endif  // LAMINA_DEPLOY_CLI_SIMULATE_COMMAND_H_
