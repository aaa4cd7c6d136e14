#include "common/topology/relocated_topology.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status/status_macros.h"
#include "common/yaml/yaml_fields.h"

namespace lamina {
namespace {

std::string Absolute(const std::string& file) {
  return std::filesystem::absolute(file).lexically_normal().string();
}

}  // namespace

absl::StatusOr<YAML::Node> RelocatableYaml(const Topology& topology) {
  LAMINA_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(topology.path));
  root["model"] = Absolute(topology.model_dir);
  if (!topology.api_key_file.empty()) root["coordinator"]["api_key_file"] = Absolute(topology.api_key_file);
  if (!topology.cluster_secret_file.empty()) root["cluster_secret_file"] = Absolute(topology.cluster_secret_file);
  const ServerTlsFiles& tls = topology.coordinator_tls;
  if (tls.enabled()) {
    root["coordinator"]["tls"]["cert"] = Absolute(tls.cert_file);
    root["coordinator"]["tls"]["key"] = Absolute(tls.key_file);
    if (!tls.ca_file.empty()) root["coordinator"]["tls"]["ca"] = Absolute(tls.ca_file);
  }
  return root;
}

std::vector<std::string> TopologyHosts(const Topology& topology) {
  std::vector<std::string> hosts = {topology.coordinator_host};
  for (const NodeSpec& node : topology.nodes) {
    if (std::find(hosts.begin(), hosts.end(), node.host) == hosts.end()) hosts.push_back(node.host);
  }
  return hosts;
}

absl::Status PlaceOnHosts(const Topology& topology, const std::vector<std::string>& hosts, YAML::Node* yaml) {
  const std::vector<std::string> from = TopologyHosts(topology);
  if (hosts.size() < from.size()) {
    return absl::InvalidArgumentError(absl::StrCat(topology.path, " has ", from.size(), " hosts (",
                                                   absl::StrJoin(from, ", "), ") but only ", hosts.size(),
                                                   " machines were given (", absl::StrJoin(hosts, ", "), ")"));
  }
  auto placed = [&](const std::string& host) {
    return hosts[std::find(from.begin(), from.end(), host) - from.begin()];
  };
  (*yaml)["coordinator"]["host"] = placed(topology.coordinator_host);
  YAML::Node nodes = (*yaml)["nodes"];
  // A tensor-parallel group's ranks come from one entry (its rank 0's), on its host.
  size_t entry = 0;
  for (size_t i = 0; i < topology.nodes.size() && entry < nodes.size(); ++i) {
    if (topology.nodes[i].tp_rank > 0) continue;
    nodes[entry++]["host"] = placed(topology.nodes[i].host);
  }
  return absl::OkStatus();
}

}  // namespace lamina
