// Placements that start and serve but run slowly: nodes of one host on one GPU with device links
// between them. Processes on one GPU take turns on it (CUDA time-slices their contexts), and a
// device link's waits spin on the GPU through their process's turns, so every exchange between
// the two may wait for a turn to end (several times slower: deploy/experiments/results/README.md).
// tcp links do not spin.
#ifndef LAMINA_COMMON_TOPOLOGY_SHARED_GPUS_H_
#define LAMINA_COMMON_TOPOLOGY_SHARED_GPUS_H_

#include <string>
#include <vector>

#include "common/topology/topology.h"

namespace lamina {

// One line per GPU that nodes with device links between them share, naming the GPU, the host,
// the nodes and what to change; empty when there is none. Device links: a memory node's
// `cuda_ipc`, named outright, to a compute node on its GPU (`auto` passes over it there:
// TransportsBetween), and the hand-overs between compute nodes under rotation over several of
// them.
std::vector<std::string> SharedGpuWarnings(const Topology& topology);

}  // namespace lamina

#endif  // LAMINA_COMMON_TOPOLOGY_SHARED_GPUS_H_
