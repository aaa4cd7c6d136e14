// A topology written again elsewhere: for a run of `lamina experiment` with other settings, or
// placed by `lamina place` onto the machines a scheduler (Slurm) allocated.
// Thread-safe: pure functions.
#ifndef LAMINA_COMMON_TOPOLOGY_RELOCATED_TOPOLOGY_H_
#define LAMINA_COMMON_TOPOLOGY_RELOCATED_TOPOLOGY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/topology/topology.h"
#include "yaml-cpp/yaml.h"

namespace lamina {

// The topology's YAML with its model and every file it names (keys, secret, TLS) as the absolute
// paths it resolved, so that a copy in another folder means the same.
absl::StatusOr<YAML::Node> RelocatableYaml(const Topology& topology);

// The topology's distinct hosts: the coordinator's, then the nodes' in their order.
std::vector<std::string> TopologyHosts(const Topology& topology);

// Replaces, in `yaml` (the topology's), the i-th of TopologyHosts(topology) by `hosts[i]`.
// InvalidArgument when `hosts` has fewer entries than the topology has hosts.
absl::Status PlaceOnHosts(const Topology& topology, const std::vector<std::string>& hosts, YAML::Node* yaml);

}  // namespace lamina

#endif  // LAMINA_COMMON_TOPOLOGY_RELOCATED_TOPOLOGY_H_
