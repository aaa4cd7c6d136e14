// SharedGpuWarnings (common/topology/shared_gpus.h): which placements `lamina up` warns of, and what
// each line says. Topologies are parsed from text; kPath (no such file) only anchors the model folder.
#include "common/topology/shared_gpus.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace lamina {
namespace {

const std::string kPath = std::string(LAMINA_SOURCE_DIR) + "/deploy/topologies/shared-gpus.yaml";

// A topology of the demo model with `pipelining` and the given nodes' YAML.
Topology Parse(const std::string& pipelining, const std::string& nodes) {
  const std::string text = absl::StrCat("model: ../models/lamina-demo-6m\npipelining: ", pipelining,
                                        "\ncoordinator:\n  port: 50151\nnodes:\n", nodes);
  auto topology = ParseTopology(text, kPath);
  EXPECT_TRUE(topology.ok()) << topology.status();
  return topology.ok() ? *std::move(topology) : Topology{};
}

std::string Compute(const std::string& name, int port, const std::string& device) {
  return absl::StrCat("  - name: ", name, "\n    role: compute\n    port: ", port, "\n    data_port: ", port + 1,
                      "\n    device: ", device, "\n");
}

std::string Memory(const std::string& name, int port, const std::string& device, const std::string& transport) {
  return absl::StrCat("  - name: ", name, "\n    role: memory\n    port: ", port, "\n    data_port: ", port + 1,
                      "\n    device: ", device, "\n    kv_capacity_tokens: 1024\n    transport: ", transport, "\n");
}

struct SharedCase {
  std::string pipelining, nodes;
  std::string opening;  // how the warning starts: the nodes, the GPU
  std::string remedy;   // how it ends
};

TEST(SharedGpusTest, EachGpuWithLinksBetweenItsNodesIsNamedWithTheRemedy) {
  const SharedCase cases[] = {
      // A memory node's cuda_ipc, named outright, to the compute node on its GPU.
      {"none", Compute("compute-0", 50161, "cuda:0") + Memory("memory-0", 50171, "cuda:0", "[cuda_ipc, tcp]"),
       "compute-0, memory-0 share cuda:0 on 127.0.0.1 with device links between them",
       "set `transport: tcp` on memory-0."},
      // Rotating compute nodes' hand-overs on one GPU.
      {"rotational",
       Compute("compute-0", 50161, "cuda:0") + Compute("compute-1", 50163, "cuda:0") +
           Memory("memory-0", 50171, "cuda:1", "cuda_ipc"),
       "compute-0, compute-1 share cuda:0 on 127.0.0.1",
       "To avoid it, give each rotating compute node a GPU of its own."},
      // Both on one GPU: one line.
      {"rotational",
       Compute("compute-0", 50161, "cuda:1") + Compute("compute-1", 50163, "cuda:1") +
           Memory("memory-0", 50171, "cuda:1", "[cuda_ipc, tcp]"),
       "compute-0, compute-1, memory-0 share cuda:1",
       "set `transport: tcp` on memory-0, and give each rotating compute node a GPU of its own."},
  };
  for (const SharedCase& c : cases) {
    SCOPED_TRACE(c.opening);
    const std::vector<std::string> warnings = SharedGpuWarnings(Parse(c.pipelining, c.nodes));
    ASSERT_EQ(warnings.size(), 1u);
    const std::string& w = warnings[0];
    EXPECT_EQ(w.rfind(c.opening, 0), 0u) << w;
    ASSERT_GE(w.size(), c.remedy.size());
    EXPECT_EQ(w.substr(w.size() - c.remedy.size()), c.remedy) << w;
  }
}

TEST(SharedGpusTest, PlacementsWithoutSpinningLinksBetweenSharersPassQuietly) {
  // tcp within one GPU (the colocated topology), and `auto` there, which passes over the device
  // links; fixed pipelining has no hand-overs; separate GPUs; other hosts; the CPU.
  for (const char* transport : {"tcp", "auto"}) {
    EXPECT_TRUE(SharedGpuWarnings(Parse("none", Compute("compute-0", 50161, "cuda:0") +
                                                    Memory("memory-0", 50171, "cuda:0", transport)))
                    .empty())
        << transport;
  }
  EXPECT_TRUE(SharedGpuWarnings(Parse("fixed", Compute("compute-0", 50161, "cuda:0") +
                                                   Compute("compute-1", 50163, "cuda:0") +
                                                   Memory("memory-0", 50171, "cuda:1", "cuda_ipc")))
                  .empty());
  EXPECT_TRUE(SharedGpuWarnings(Parse("rotational", Compute("compute-0", 50161, "cuda:0") +
                                                        Compute("compute-1", 50163, "cuda:1") +
                                                        Memory("memory-0", 50171, "cuda:2", "cuda_ipc")))
                  .empty());
  std::string other_host = Memory("memory-0", 50171, "cuda:0", "auto");
  other_host.insert(other_host.find("    role"), "    host: 10.0.0.2\n");
  EXPECT_TRUE(SharedGpuWarnings(Parse("none", Compute("compute-0", 50161, "cuda:0") + other_host)).empty());
  EXPECT_TRUE(SharedGpuWarnings(Parse("none", Compute("compute-0", 50161, "cpu") +
                                                  Memory("memory-0", 50171, "cpu", "tcp")))
                  .empty());
}

}  // namespace
}  // namespace lamina
