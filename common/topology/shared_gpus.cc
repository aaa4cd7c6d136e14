#include "common/topology/shared_gpus.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lamina {
namespace {

// Whether some compute node of `nodes` (the nodes of one GPU) tries cuda_ipc to `memory_node`.
bool CudaIpcWithin(const std::vector<const NodeSpec*>& nodes, const NodeSpec& memory_node) {
  for (const NodeSpec* node : nodes) {
    if (node->kind != NodeKind::kCompute) continue;
    const std::vector<std::string> t = TransportsBetween(*node, memory_node);
    if (std::find(t.begin(), t.end(), "cuda_ipc") != t.end()) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> SharedGpuWarnings(const Topology& topology) {
  std::map<std::pair<std::string, std::string>, std::vector<const NodeSpec*>> by_gpu;  // host, device
  for (const NodeSpec& node : topology.nodes) {
    if (node.device != "cpu") by_gpu[{node.host, node.device}].push_back(&node);
  }
  const bool hand_overs = topology.RotationReplicas() > 0;
  std::vector<std::string> warnings;
  for (const auto& [gpu, nodes] : by_gpu) {
    std::vector<std::string> computes, ipc_memories;
    for (const NodeSpec* node : nodes) {
      if (node->kind == NodeKind::kCompute) {
        computes.push_back(node->name);
      } else if (CudaIpcWithin(nodes, *node)) {
        ipc_memories.push_back(node->name);
      }
    }
    const bool linked_memory = !computes.empty() && !ipc_memories.empty();
    const bool linked_computes = hand_overs && computes.size() > 1;
    if (!linked_memory && !linked_computes) continue;
    std::vector<std::string> names = computes;
    if (linked_memory) names.insert(names.end(), ipc_memories.begin(), ipc_memories.end());
    std::string fix;
    if (linked_memory) {
      fix = absl::StrCat("set `transport: tcp` on ", absl::StrJoin(ipc_memories, " and "));
    }
    if (linked_computes) {
      absl::StrAppend(&fix, fix.empty() ? "" : ", and ", "give each rotating compute node a GPU of its own");
    }
    warnings.push_back(absl::StrCat(
        absl::StrJoin(names, ", "), " share ", gpu.second, " on ", gpu.first,
        " with device links between them: processes on one GPU take turns on it and the links' waits spin "
        "through their turns, which was slow on H200s (0.14x the tokens/s; deploy/TOPOLOGY.md). To avoid it, ",
        fix, "."));
  }
  return warnings;
}

}  // namespace lamina
