// Tensor-parallel compute nodes on a real cluster (`lamina up`, one process per rank on loopback):
// each rank holds 1/N of every layer's heads and MLP and of the LM head, the ranks all-reduce
// their partial sums and gather the logits (compute_node/tensor_parallel/), and attend their own
// heads in their share of the group's pool or on memory nodes, each rank sending only its heads'
// q/k/v. The outputs are single-process mode's; a dead rank fails its group's requests promptly,
// naming it, and a dead memory node only its own sequences.
#include <signal.h>

#include <string>
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

// 32 concurrent requests of the demo model (8 query and 4 KV heads, MLP 688, vocabulary 1024):
// greedy ones must equal single-process mode; seeded sampling every fourth must equal one rank's.
std::vector<lamina::v1::GenerateRequest> Requests(LocalCluster& local) {
  const std::vector<std::string> texts = {"Attention offloading", "The memory devices", "FlashAttention",
                                          "In this paper, we",    "Decode attention is", "GPU memory"};
  std::vector<lamina::v1::GenerateRequest> requests;
  for (int i = 0; i < 32; ++i) {
    lamina::v1::GenerateRequest r = IdsRequest(local.tokenizer().EncodePrompt(texts[i % texts.size()]), 8 + (i * 7) % 41);
    if (i % 4 == 3) {
      r.mutable_sampling()->set_temperature(0.8f);
      r.mutable_sampling()->set_top_k(40);
      r.mutable_sampling()->set_seed(200 + i);
    }
    requests.push_back(r);
  }
  return requests;
}

// Where a group keeps its KV: a pool of its own (each rank its heads' share of every slot), or
// memory nodes, to which each rank sends only its heads' q/k/v (head-level partitioning).
struct Placement {
  int ranks;
  int memory_nodes;  // 0: the group's own pool
};

std::vector<std::vector<int32_t>> Serve(const Placement& placement,
                                        const std::vector<lamina::v1::GenerateRequest>& requests) {
  ClusterOptions options;
  options.memory_nodes = placement.memory_nodes;
  options.kv_dtype = placement.memory_nodes > 0 ? "bfloat16" : "";
  options.compute_kv_capacity_tokens = placement.memory_nodes > 0 ? 0 : 8192;
  options.tensor_parallel = placement.ranks;
  SpreadServed served = ServeOnEveryComputeProcess(options, requests);
  EXPECT_EQ(served.compute_processes, placement.ranks);
  EXPECT_EQ(served.memory_nodes_attending, placement.memory_nodes) << "every memory node serves the group";
  return served.ids;
}

TEST(TensorParallelTest, TwoAndFourRanksServeThirtyTwoRequestsAsOneRankDoes) {
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok()) << local.status();
  const std::vector<lamina::v1::GenerateRequest> requests = Requests(**local);
  const std::vector<std::vector<int32_t>> one = Serve({1, 0}, requests);
  ASSERT_EQ(one.size(), requests.size());
  for (const Placement& placement : {Placement{2, 0}, Placement{4, 0}, Placement{2, 1}, Placement{4, 2}}) {
    SCOPED_TRACE(absl::StrCat(placement.ranks, " ranks, ", placement.memory_nodes, " memory nodes"));
    const std::vector<std::vector<int32_t>> ids = Serve(placement, requests);
    ASSERT_EQ(ids.size(), requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_EQ(ids[i].size(), static_cast<size_t>(requests[i].max_tokens())) << "request " << i;
      if (requests[i].sampling().temperature() == 0) {
        std::vector<int32_t> prompt(requests[i].token_ids().ids().begin(), requests[i].token_ids().ids().end());
        EXPECT_EQ(ids[i], SingleProcessIds(**local, prompt, requests[i].max_tokens())) << "request " << i;
      }
      EXPECT_EQ(ids[i], one[i]) << "request " << i;
    }
  }
}

TEST(TensorParallelTest, AKilledRankFailsItsGroupsRequestsPromptlyNamingIt) {
  ClusterOptions options;
  options.memory_nodes = 0;
  options.compute_kv_capacity_tokens = 8192;
  options.tensor_parallel = 2;
  options.max_migrations = 0;  // one group: nowhere to recompute
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok()) << local.status();
  ExpectKillingFailsEveryRequest(**cluster, (*local)->tokenizer().EncodePrompt("The memory devices"), 4,
                                 "compute-0-rank1", "compute-0");
}

// Two groups under `fixed` pipelining, a batch each: a killed rank of one takes its group down,
// and the requests it was running are recomputed on the other group, with single-process outputs.
TEST(TensorParallelTest, AKilledRanksRequestsAreRecomputedOnTheOtherGroup) {
  ClusterOptions options;
  options.memory_nodes = 0;
  options.compute_kv_capacity_tokens = 8192;
  options.compute_nodes = 2;
  options.tensor_parallel = 2;
  options.pipelining = "fixed";
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok()) << local.status();
  const std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt("The memory devices");
  const std::vector<int32_t> expected = SingleProcessIds(**local, prompt, 300);
  RequestsInFlight requests((*cluster)->client(), std::vector(8, IdsRequest(prompt, 300)));
  ASSERT_TRUE(requests.AwaitTokens(10, absl::Seconds(30))) << "the requests never got going";
  auto pid = (*cluster)->NodePid("compute-0-rank1");
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_EQ(::kill(static_cast<pid_t>(*pid), SIGKILL), 0);
  for (const Outcome& outcome : requests.Join()) {
    ASSERT_TRUE(outcome.status.ok()) << outcome.status;
    EXPECT_EQ(outcome.ids, expected);
  }
}

TEST(TensorParallelTest, AKilledMemoryNodeEndsOnlyItsSequencesOfTheGroup) {
  ClusterOptions options;
  options.memory_nodes = 2;
  options.kv_dtype = "bfloat16";
  options.tensor_parallel = 2;
  options.max_migrations = 0;  // the blast radius, not the recomputation
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok()) << local.status();
  const std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt("The memory devices");
  // Six requests over the two memory nodes: memory-0's go on.
  ExpectKillingMemoryOneEndsOnlyItsSequences(**cluster, prompt, SingleProcessIds(**local, prompt, 600), 6, 1);
}

}  // namespace
}  // namespace lamina::testing
