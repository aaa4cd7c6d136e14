#include "deploy/cli/place_command.h"

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/flags/flags.h"
#include "common/status/status_macros.h"
#include "common/topology/relocated_topology.h"
#include "common/topology/topology.h"

namespace lamina::cli {

const char kPlaceUsage[] =
    "usage: lamina place TOPOLOGY.yaml --hosts H1,H2,... --out FILE\n"
    "  Writes TOPOLOGY with its hosts (the coordinator's first, then the nodes' in order) replaced\n"
    "  by H1, H2, ... (names or addresses of the machines to run on, e.g. a Slurm allocation's),\n"
    "  and its files as absolute paths. Then run `lamina up FILE --host Hi` on each machine\n"
    "  (deploy/slurm/lamina.sbatch does both). Prints each machine's processes.\n";

namespace {

absl::Status Place(const std::vector<std::string>& args) {
  if (args.empty() || args[0].rfind("--", 0) == 0) return absl::InvalidArgumentError("missing TOPOLOGY.yaml");
  LAMINA_ASSIGN_OR_RETURN(Flags flags, Flags::Parse({args.begin() + 1, args.end()}, {"hosts", "out"}, {}));
  if (!flags.Has("hosts") || !flags.Has("out")) return absl::InvalidArgumentError("--hosts and --out are required");
  const std::vector<std::string> hosts = absl::StrSplit(flags.String("hosts", ""), ',', absl::SkipEmpty());
  LAMINA_ASSIGN_OR_RETURN(Topology topology, LoadTopology(args[0]));
  LAMINA_ASSIGN_OR_RETURN(YAML::Node yaml, RelocatableYaml(topology));
  LAMINA_RETURN_IF_ERROR(PlaceOnHosts(topology, hosts, &yaml));
  const std::string out_path = flags.String("out", "");
  {
    std::ofstream out(out_path);
    out << "# Written by lamina place from " << topology.path << " onto " << absl::StrJoin(hosts, ", ") << "\n"
        << YAML::Dump(yaml) << "\n";
    if (!out) return absl::PermissionDeniedError(absl::StrCat(out_path, ": cannot be written"));
  }
  LAMINA_ASSIGN_OR_RETURN(Topology placed, LoadTopology(out_path));  // what `lamina up` will read
  for (const std::string& host : TopologyHosts(placed)) {
    std::vector<std::string> processes;
    if (placed.coordinator_host == host) processes.push_back("coordinator");
    for (const NodeSpec& node : placed.nodes) {
      if (node.host == host) processes.push_back(node.name);
    }
    std::printf("%s: %s\n", host.c_str(), absl::StrJoin(processes, ", ").c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunPlace(const std::vector<std::string>& args) {
  absl::Status status = Place(args);
  if (status.ok()) return 0;
  std::fprintf(stderr, "lamina place: %s\n", std::string(status.message()).c_str());
  return absl::IsInvalidArgument(status) || absl::IsNotFound(status) ? 2 : 1;
}

}  // namespace lamina::cli
