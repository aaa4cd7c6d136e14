// A layer split on a real cluster (`lamina up`, separate processes on loopback): compute nodes
// with `layers: [first, end)` each compute their share of every batch, which passes from one to
// the next (common/topology/slice_route.h), with several batches in flight. The outputs are those
// of single-process mode, whichever way the layers and the KV caches are spread: on memory nodes,
// or in the split's own pool (each node holding its layers' share of every slot).
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/embedded/local_cluster.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/spread_model_checks.h"
#include "tests/integration/requests_in_flight.h"
#include "tests/integration/single_process.h"
#include "tests/support/golden.h"

namespace lamina::testing {
namespace {

using Split = std::vector<std::pair<int64_t, int64_t>>;

// Requests of the demo model (6 layers): greedy ones, and seeded sampling every third.
std::vector<lamina::v1::GenerateRequest> Requests(LocalCluster& local, int count) {
  const std::vector<std::string> texts = {"Attention offloading", "The memory devices",  "FlashAttention",
                                          "In this paper, we",    "Decode attention is", "GPU memory"};
  std::vector<lamina::v1::GenerateRequest> requests;
  for (int i = 0; i < count; ++i) {
    lamina::v1::GenerateRequest r = IdsRequest(local.tokenizer().EncodePrompt(texts[i % texts.size()]), 6 + (i * 5) % 23);
    if (i % 3 == 2) {  // the last node samples: the seed, not the node, decides the tokens
      r.mutable_sampling()->set_temperature(0.8f);
      r.mutable_sampling()->set_top_k(40);
      r.mutable_sampling()->set_seed(100 + i);
    }
    requests.push_back(r);
  }
  return requests;
}

TEST(LayerSplitTest, SplitsOverTwoAndThreeComputeNodesGiveSingleProcessOutputs) {
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok()) << local.status();
  const std::vector<lamina::v1::GenerateRequest> requests = Requests(**local, 18);

  ClusterOptions whole;  // one compute node: the sampled requests' reference
  whole.max_batch = 4;
  const std::vector<std::vector<int32_t>> reference = ServeOnEveryComputeProcess(whole, requests).ids;
  ASSERT_EQ(reference.size(), requests.size());

  // The KV caches on memory nodes, or in the split's own pool (each node holding the layers it
  // attends).
  struct Case {
    Split layers;
    int memory_nodes;
    int64_t pool_tokens;
  };
  for (const Case& c : std::vector<Case>{{{{0, 3}, {3, 6}}, 1, 0},
                                         {{{0, 3}, {3, 6}}, 2, 0},
                                         {{{0, 1}, {1, 4}, {4, 6}}, 2, 0},
                                         {{{0, 5}, {5, 6}}, 1, 0},
                                         {{{0, 3}, {3, 6}}, 0, 4096},
                                         {{{0, 1}, {1, 4}, {4, 6}}, 0, 4096}}) {
    std::string name;
    for (const auto& [first, end] : c.layers) absl::StrAppend(&name, "[", first, ",", end, ")");
    SCOPED_TRACE(absl::StrCat(name, " with ", c.memory_nodes, " memory nodes and pools of ", c.pool_tokens));
    ClusterOptions options;
    options.compute_nodes = static_cast<int>(c.layers.size());
    options.layers = c.layers;
    options.memory_nodes = c.memory_nodes;
    options.compute_kv_capacity_tokens = c.pool_tokens;
    options.pipelining = "auto";
    options.max_batch = 4;  // several batches in flight, each admitting over several steps
    const std::vector<std::vector<int32_t>> ids = ServeOnEveryComputeProcess(options, requests).ids;
    ASSERT_EQ(ids.size(), requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_EQ(ids[i].size(), static_cast<size_t>(requests[i].max_tokens())) << "request " << i;
      if (requests[i].sampling().temperature() == 0) {
        std::vector<int32_t> prompt(requests[i].token_ids().ids().begin(), requests[i].token_ids().ids().end());
        EXPECT_EQ(ids[i], SingleProcessIds(**local, prompt, requests[i].max_tokens())) << "request " << i;
      }
      EXPECT_EQ(ids[i], reference[i]) << "request " << i;
    }
  }
}

// Every batch passes through every node of a split: a killed node fails the requests in flight
// promptly, naming it (none is left to recompute them), and the cluster says so to new ones.
TEST(LayerSplitTest, AKilledNodeFailsTheRequestsInFlightPromptlyNamingIt) {
  ClusterOptions options;
  options.compute_nodes = 2;
  options.layers = {{0, 3}, {3, 6}};
  options.memory_nodes = 1;
  options.pipelining = "auto";
  options.max_migrations = 0;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok()) << local.status();
  ExpectKillingFailsEveryRequest(**cluster, (*local)->tokenizer().EncodePrompt("The memory devices"), 6, "compute-1",
                                 "compute-1");
}

}  // namespace
}  // namespace lamina::testing
