// `lamina`: the command-line front door.
#include <cstdio>
#include <string>
#include <vector>

#include "deploy/cli/bench_command.h"
#include "deploy/cli/cert_command.h"
#include "deploy/cli/experiment_command.h"
#include "deploy/cli/generate_command.h"
#include "deploy/cli/k8s_command.h"
#include "deploy/cli/place_command.h"
#include "deploy/cli/plan_command.h"
#include "deploy/cli/serve_command.h"
#include "deploy/cli/simulate_command.h"
#include "deploy/cli/status_command.h"
#include "deploy/cli/up_command.h"

namespace {

constexpr char kUsage[] =
    "usage: lamina COMMAND [flags]\n"
    "commands:\n"
    "  serve      serve a model folder with one command (OpenAI and gRPC APIs), no topology needed\n"
    "  up         start a cluster from a topology file and supervise it until Ctrl-C\n"
    "  place      map a topology's hosts onto given machines (a Slurm allocation's)\n"
    "  k8s        write Kubernetes manifests for a topology\n"
    "  generate   generate text, here (--model DIR) or on a running cluster (--endpoint HOST:PORT)\n"
    "  status     show a running cluster's nodes, KV use, queue and throughput\n"
    "  bench      drive a running cluster with a workload; report throughput, latency, goodput, cost\n"
    "  experiment sweep topologies x batch limits x context lengths; write a report with plots\n"
    "  plan       rank topologies for a model, workload and prices by predicted tokens/s per dollar\n"
    "  simulate   predict clusters larger than any we can run, from measured per-operation costs\n"
    "  cert       write a self-signed TLS certificate for a coordinator\n"
    "  help       show this message (lamina help COMMAND, or COMMAND --help, for a command's flags)\n"
    "  version    show this program's version (also --version)\n";

struct Command {
  const char* name;
  int (*run)(const std::vector<std::string>& args);
  const char* usage;
};

const Command kCommands[] = {
    {"serve", lamina::cli::RunServe, lamina::cli::kServeUsage},
    {"up", lamina::cli::RunUp, lamina::cli::kUpUsage},
    {"place", lamina::cli::RunPlace, lamina::cli::kPlaceUsage},
    {"k8s", lamina::cli::RunK8s, lamina::cli::kK8sUsage},
    {"generate", lamina::cli::RunGenerate, lamina::cli::kGenerateUsage},
    {"status", lamina::cli::RunStatus, lamina::cli::kStatusUsage},
    {"bench", lamina::cli::RunBenchCommand, lamina::cli::kBenchUsage},
    {"experiment", lamina::cli::RunExperimentCommand, lamina::cli::kExperimentUsage},
    {"plan", lamina::cli::RunPlanCommand, lamina::cli::kPlanUsage},
    {"simulate", lamina::cli::RunSimulateCommand, lamina::cli::kSimulateUsage},
    {"cert", lamina::cli::RunCert, lamina::cli::kCertUsage},
};

const Command* Find(const std::string& name) {
  for (const Command& command : kCommands) {
    if (name == command.name) return &command;
  }
  return nullptr;
}

bool IsHelp(const std::string& arg) { return arg == "--help" || arg == "-h" || arg == "help"; }

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  const std::string name = args[0];
  args.erase(args.begin());
  if (name == "version" || name == "--version") {
    std::printf("lamina %s\n", LAMINA_VERSION);
    return 0;
  }
  if (IsHelp(name)) {
    const Command* command = args.empty() ? nullptr : Find(args[0]);
    std::printf("%s", command != nullptr ? command->usage : kUsage);
    return 0;
  }
  const Command* command = Find(name);
  if (command == nullptr) {
    std::fprintf(stderr, "lamina: unknown command '%s'\n%s", name.c_str(), kUsage);
    return 2;
  }
  for (const std::string& arg : args) {  // `lamina COMMAND ... --help`
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", command->usage);
      return 0;
    }
  }
  return command->run(args);
}
