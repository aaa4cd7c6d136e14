// `lamina`: the command-line front door.
#include <cstdio>
#include <string>
#include <vector>

#include "deploy/cli/bench_command.h"
#include "deploy/cli/cert_command.h"
#include "deploy/cli/experiment_command.h"
#include "deploy/cli/generate_command.h"
#include "deploy/cli/plan_command.h"
#include "deploy/cli/simulate_command.h"
#include "deploy/cli/status_command.h"
#include "deploy/cli/up_command.h"

namespace {

constexpr char kUsage[] =
    "usage: lamina COMMAND [flags]\n"
    "commands:\n"
    "  up         start a cluster from a topology file and supervise it until Ctrl-C\n"
    "  generate   generate text, here (--model DIR) or on a running cluster (--endpoint HOST:PORT)\n"
    "  status     show a running cluster's nodes, KV use, queue and throughput\n"
    "  bench      drive a running cluster with a workload; report throughput, latency, goodput, cost\n"
    "  experiment sweep topologies x batch limits x context lengths; write a report with plots\n"
    "  plan       rank topologies for a model, workload and prices by predicted tokens/s per dollar\n"
    "  simulate   predict clusters larger than any we can run, from measured per-operation costs\n"
    "  cert       write a self-signed TLS certificate for a coordinator\n"
    "  help       show this message (lamina help COMMAND for a command's flags)\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "generate") return lamina::cli::RunGenerate(args);
  if (command == "status") return lamina::cli::RunStatus(args);
  if (command == "up") return lamina::cli::RunUp(args);
  if (command == "bench") return lamina::cli::RunBenchCommand(args);
  if (command == "experiment") return lamina::cli::RunExperimentCommand(args);
  if (command == "plan") return lamina::cli::RunPlanCommand(args);
  if (command == "simulate") return lamina::cli::RunSimulateCommand(args);
  if (command == "cert") return lamina::cli::RunCert(args);
  if (command == "help" || command == "--help" || command == "-h") {
    if (!args.empty() && args[0] == "generate") {
      std::printf("%s", lamina::cli::kGenerateUsage);
    } else if (!args.empty() && args[0] == "up") {
      std::printf("%s", lamina::cli::kUpUsage);
    } else if (!args.empty() && args[0] == "simulate") {
      std::printf("%s", lamina::cli::kSimulateUsage);
    } else if (!args.empty() && args[0] == "plan") {
      std::printf("%s", lamina::cli::kPlanUsage);
    } else if (!args.empty() && args[0] == "experiment") {
      std::printf("%s", lamina::cli::kExperimentUsage);
    } else if (!args.empty() && args[0] == "bench") {
      std::printf("%s", lamina::cli::kBenchUsage);
    } else if (!args.empty() && args[0] == "cert") {
      std::printf("%s", lamina::cli::kCertUsage);
    } else if (!args.empty() && args[0] == "status") {
      std::printf("%s", lamina::cli::kStatusUsage);
    } else {
      std::printf("%s", kUsage);
    }
    return 0;
  }
  std::fprintf(stderr, "lamina: unknown command '%s'\n%s", command.c_str(), kUsage);
  return 2;
}
