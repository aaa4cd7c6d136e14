// Clusters whose compute node holds a KV pool of its own (local attention): alone (the colocated
// deployment, no memory node at all), and beside memory nodes (hybrid placement), where one step
// attends some sequences locally and sends the others to the memory nodes. Outputs must be those
// of single-process mode wherever each sequence was placed, and a dead memory node must cost only
// its own sequences.
#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/embedded/local_cluster.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/requests_in_flight.h"
#include "tests/integration/spread_model_checks.h"
#include "tests/integration/single_process.h"
#include "tests/support/golden.h"

namespace lamina::testing {
namespace {

// The most sequences each node held at once while `work` ran, from `lamina status`.
std::map<std::string, int64_t> MostSequencesWhile(ClusterHarness& cluster, const std::function<void()>& work) {
  std::atomic<bool> done{false};
  std::map<std::string, int64_t> most;
  std::thread watcher([&] {
    while (!done) {
      auto status = cluster.client().Status(absl::Seconds(1));
      if (status.ok()) {
        for (const auto& n : status->nodes()) most[n.name()] = std::max(most[n.name()], n.num_sequences());
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  work();
  done = true;
  watcher.join();
  return most;
}

// 32 concurrent greedy requests of 8 to 48 tokens; each must equal single-process mode's output.
std::map<std::string, int64_t> ExpectThirtyTwoRequestsMatchSingleProcessMode(ClusterHarness& cluster) {
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  EXPECT_TRUE(local.ok()) << local.status();
  const std::vector<std::string> texts = {"Attention offloading", "The memory devices", "FlashAttention",
                                          "In this paper, we", "We", "The KV cache", "Decode attention is",
                                          "GPU memory"};
  std::vector<lamina::v1::GenerateRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 32; ++i) {
    const std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt(texts[i % texts.size()]);
    const int max_tokens = 8 + (i * 7) % 41;
    requests.push_back(IdsRequest(prompt, max_tokens));
    expected.push_back(SingleProcessIds(**local, prompt, max_tokens));
  }
  std::vector<Outcome> outcomes;
  const std::map<std::string, int64_t> most =
      MostSequencesWhile(cluster, [&] { outcomes = GenerateConcurrently(cluster.client(), requests); });
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(outcomes[i].status.ok()) << "request " << i << ": " << outcomes[i].status;
    EXPECT_EQ(outcomes[i].ids, expected[i]) << "request " << i;
  }
  return most;
}

TEST(LocalAttentionTest, AComputeNodeAloneServesThirtyTwoRequestsAsSingleProcessModeDoes) {
  ClusterOptions options;
  options.memory_nodes = 0;
  options.compute_kv_capacity_tokens = 8192;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::map<std::string, int64_t> most = ExpectThirtyTwoRequestsMatchSingleProcessMode(**cluster);
  EXPECT_GT(most.at("compute-0"), 0) << "the compute node's own pool never held a sequence";

  // The golden prompts' greedy text, through the same pool.
  nlohmann::json golden = LoadGoldenJson("lamina-demo-6m");
  for (int p = 0; p < 4; ++p) {
    const std::vector<int32_t> greedy = golden["prompts"][p]["greedy_ids"].get<std::vector<int32_t>>();
    Outcome out = Generate((*cluster)->client(),
                           IdsRequest(golden["prompts"][p]["ids"].get<std::vector<int32_t>>(),
                                      static_cast<int>(greedy.size())));
    ASSERT_TRUE(out.status.ok()) << out.status;
    EXPECT_EQ(out.ids, greedy) << "prompt " << p;
  }
  // Every slot back once the requests are done (heartbeats carry the pool's use).
  auto status = (*cluster)->client().Status(absl::Seconds(1));
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->nodes_size(), 1);
  EXPECT_EQ(status->nodes(0).kv_capacity_slots(), 8192);
}

TEST(LocalAttentionTest, StepsMixingTheLocalPoolAndMemoryNodesGiveSingleProcessOutputs) {
  // A local pool too small for the load: local_first fills it, the rest go to the memory nodes,
  // and the steps run both kinds of sequences together.
  ClusterOptions options;
  options.compute_kv_capacity_tokens = 300;
  options.kv_capacity_tokens = 4096;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::map<std::string, int64_t> most = ExpectThirtyTwoRequestsMatchSingleProcessMode(**cluster);
  EXPECT_GT(most.at("compute-0"), 0) << "the local pool never held a sequence";
  EXPECT_GT(most.at("memory-0") + most.at("memory-1"), 0) << "no memory node held a sequence";
}

TEST(LocalAttentionTest, OffloadFirstPlacesOnMemoryNodesWhileTheyHaveRoom) {
  ClusterOptions options;
  options.compute_kv_capacity_tokens = 4096;
  options.placement = "offload_first";
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::map<std::string, int64_t> most = ExpectThirtyTwoRequestsMatchSingleProcessMode(**cluster);
  EXPECT_EQ(most.at("compute-0"), 0) << "the memory nodes had room for every request";
  EXPECT_GT(most.at("memory-0"), 0);
  EXPECT_GT(most.at("memory-1"), 0);
}

TEST(LocalAttentionTest, BalancedPlacementFillsTheLocalPoolThenSizesTheMemoryNodesShares) {
  // One row on each memory node while the rates are unknown, then each memory node capped at the rows it
  // attends within the compute node's step (balanced_placement_test has the arithmetic): on this
  // machine's tiny model a memory node attends far faster than a step computes, so the caps are
  // wide, and every request runs with single-process outputs, the overflow on the memory nodes.
  ClusterOptions options;
  options.compute_kv_capacity_tokens = 300;
  options.kv_capacity_tokens = 4096;
  options.placement = "balanced";
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::map<std::string, int64_t> most = ExpectThirtyTwoRequestsMatchSingleProcessMode(**cluster);
  EXPECT_GT(most.at("compute-0"), 0) << "the local pool never held a sequence";
  // The memory nodes attended rows (at least the probes) and reported them, from which the
  // coordinator sized their shares. How many rows they keep depends on the machine's load: a
  // mixed step slower than the pool's own withdraws them (DecodePace), so no count is asserted.
  auto status = (*cluster)->client().Status(absl::Seconds(1));
  ASSERT_TRUE(status.ok()) << status.status();
  int64_t rows = 0;
  for (const auto& node : status->nodes()) {
    if (node.role() == lamina::v1::NODE_ROLE_MEMORY) rows += node.load().attended_rows();
  }
  EXPECT_GT(rows, 0) << "no memory node attended a row";
}

TEST(LocalAttentionTest, KillingAMemoryNodeLeavesTheLocalPoolsSequencesGoingOn) {
  // Eight long requests: the local pool takes the first two, the memory nodes the rest.
  ClusterOptions options;
  options.max_migrations = 0;  // the blast radius, not the recomputation (failover_test)
  options.compute_kv_capacity_tokens = 1300;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok());
  const std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt("The memory devices");
  // The local pool's two and memory-0's survive; memory-1's fail.
  ExpectKillingMemoryOneEndsOnlyItsSequences(**cluster, prompt, SingleProcessIds(**local, prompt, 600), 8, 2);
}

}  // namespace
}  // namespace lamina::testing
