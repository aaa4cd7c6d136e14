// Staggered pipelining on a real cluster (`lamina up`, separate processes on loopback): the modes
// give the same tokens, a dead compute node ends only what it served, a dead memory node under
// rotation only its own sequences, and `auto` adds its second batch only above its threshold.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/embedded/local_cluster.h"
#include "gtest/gtest.h"
#include "lamina/v1/generation.grpc.pb.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/requests_in_flight.h"
#include "tests/integration/single_process.h"
#include "tests/support/golden.h"

namespace lamina::testing {
namespace {

// Eight requests of one prompt (600 tokens each) in flight, and node `victim` killed 400 ms in:
// each survivor must give the single-process tokens, and each other request must fail UNAVAILABLE
// with `named` in its message, within `within` of the kill. How many did each.
struct KillTally {
  int failed = 0;
  int succeeded = 0;
};
KillTally KillMidRunAndCheck(ClusterHarness& cluster, const std::string& victim, const std::string& named,
                             absl::Duration within) {
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  if (!local.ok()) {
    ADD_FAILURE() << local.status();
    return {};
  }
  const std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt("The memory devices");
  const std::vector<int32_t> expected = SingleProcessIds(**local, prompt, 600);
  RequestsInFlight requests(cluster.client(), std::vector(8, IdsRequest(prompt, 600)));
  if (!requests.AwaitTokens(20, absl::Seconds(30))) ADD_FAILURE() << "the requests never got going";
  // Mid-run now, every batch full.
  auto pid = cluster.NodePid(victim);
  if (!pid.ok() || ::kill(static_cast<pid_t>(*pid), SIGKILL) != 0) {
    ADD_FAILURE() << "could not kill " << victim << ": " << pid.status();
    requests.Join();
    return {};
  }
  const absl::Time killed = absl::Now();
  const std::vector<Outcome> outcomes = requests.Join();
  KillTally tally;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const Outcome& o = outcomes[i];
    if (o.status.ok()) {
      ++tally.succeeded;
      EXPECT_EQ(o.ids, expected) << "request " << i << ": a survivor's output must be unaffected";
    } else {
      ++tally.failed;
      EXPECT_EQ(o.status.code(), absl::StatusCode::kUnavailable) << o.status;
      EXPECT_NE(std::string(o.status.message()).find(named), std::string::npos) << o.status;
      EXPECT_LT(o.ended - killed, within) << "request " << i;
    }
  }
  return tally;
}

// Staggered pipelining changes when and where batches run, never what they compute: the same
// requests give the same tokens under `none` (one batch), `fixed` (a batch on each of two compute
// nodes), `rotational` on one compute node (two batches alternating on it) and `rotational` over
// two and three compute nodes (three and four batches, each batch's slices moving from node to
// node), with and without steps staggered, greedy and seeded sampling alike; in `fixed` and over
// several nodes every node works.
TEST(PipeliningTest, ModesGiveIdenticalOutputs) {
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok()) << local.status();
  const std::vector<std::string> texts = {"Attention offloading", "The memory devices",  "FlashAttention",
                                          "In this paper, we",    "Decode attention is", "GPU memory"};
  std::vector<lamina::v1::GenerateRequest> requests;
  for (int i = 0; i < 18; ++i) {
    lamina::v1::GenerateRequest r =
        IdsRequest((*local)->tokenizer().EncodePrompt(texts[i % texts.size()]), 6 + (i * 5) % 23);
    if (i % 3 == 2) {  // seeded sampling: the seed, not the batch, decides the tokens
      r.mutable_sampling()->set_temperature(0.8f);
      r.mutable_sampling()->set_top_k(40);
      r.mutable_sampling()->set_seed(100 + i);
    }
    requests.push_back(r);
  }
  struct Mode {
    std::string pipelining;
    int compute_nodes;
    bool stagger = false;
  };
  std::map<std::string, std::vector<std::vector<int32_t>>> outputs;
  for (const Mode& m : std::vector<Mode>{{"none", 1},
                                         {"fixed", 2},
                                         {"rotational", 1},
                                         {"rotational", 1, /*stagger=*/true},
                                         {"rotational", 2},
                                         {"rotational", 3},
                                         {"rotational", 3, /*stagger=*/true}}) {
    const std::string& mode = m.pipelining;
    const int compute_nodes = m.compute_nodes;
    SCOPED_TRACE(absl::StrCat(mode, " on ", compute_nodes, " compute nodes", m.stagger ? ", staggered" : ""));
    ClusterOptions options;
    options.pipelining = mode;
    options.compute_nodes = compute_nodes;
    options.stagger = m.stagger;
    options.max_batch = 4;  // several iterations' worth of admissions per batch
    auto cluster = ClusterHarness::Start(options);
    ASSERT_TRUE(cluster.ok()) << mode << ": " << cluster.status();
    const std::vector<Outcome> outcomes = GenerateConcurrently((*cluster)->client(), requests);
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(outcomes[i].status.ok()) << mode << " request " << i << ": " << outcomes[i].status;
      ASSERT_EQ(outcomes[i].ids.size(), static_cast<size_t>(requests[i].max_tokens())) << mode << " request " << i;
      outputs[absl::StrCat(mode, compute_nodes, m.stagger ? " staggered" : "")].push_back(outcomes[i].ids);
    }
    if (compute_nodes > 1) {
      auto status = (*cluster)->client().Status(absl::Seconds(5));
      ASSERT_TRUE(status.ok()) << status.status();
      absl::SleepFor(absl::Milliseconds(300));  // a heartbeat past the last step
      status = (*cluster)->client().Status(absl::Seconds(5));
      ASSERT_TRUE(status.ok()) << status.status();
      for (const auto& node : status->nodes()) {
        if (node.role() == lamina::v1::NODE_ROLE_COMPUTE) {
          EXPECT_GT(node.load().busy_count(), 0) << node.name() << " ran no plan";
        }
      }
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].sampling().temperature() == 0) {
      std::vector<int32_t> prompt(requests[i].token_ids().ids().begin(), requests[i].token_ids().ids().end());
      EXPECT_EQ(outputs["none1"][i], SingleProcessIds(**local, prompt, requests[i].max_tokens())) << "request " << i;
    }
    for (const char* mode :
         {"fixed2", "rotational1", "rotational1 staggered", "rotational2", "rotational3", "rotational3 staggered"}) {
      EXPECT_EQ(outputs[mode][i], outputs["none1"][i]) << mode << ", request " << i;
    }
  }
}

// Under `fixed` pipelining a dead compute node fails only its own batch's requests (with no moves
// allowed: failover_test has them recomputed); the other compute node serves everything after.
TEST(PipeliningTest, KillingOneOfTwoComputeNodesFailsOnlyItsBatchAndTheOtherServesNewRequests) {
  ClusterOptions options;
  options.max_migrations = 0;
  options.pipelining = "fixed";
  options.compute_nodes = 2;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const KillTally tally = KillMidRunAndCheck(**cluster, "compute-1", "compute", absl::InfiniteDuration());
  EXPECT_GT(tally.failed, 0);
  EXPECT_GT(tally.succeeded, 0);

  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok());
  const std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt("The memory devices");
  const std::vector<int32_t> expected = SingleProcessIds(**local, prompt, 16);
  // New requests, more than one batch's worth, all go to the surviving compute node.
  std::vector<lamina::v1::GenerateRequest> after(6, IdsRequest(prompt, 16));
  for (const Outcome& o : GenerateConcurrently((*cluster)->client(), after)) {
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.ids, expected);
  }
}

// Under rotational pipelining over two compute nodes every batch runs through both, so killing
// one ends every running request, promptly and naming it (the survivor's runners, waiting for hand-
// overs that will never come, do not hold the clients), and new requests are refused at once
// rather than left waiting.
TEST(PipeliningTest, KillingARotatingComputeNodeEndsItsBatchesPromptlyNamingIt) {
  ClusterOptions options;
  options.pipelining = "rotational";
  options.compute_nodes = 2;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok());
  const std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt("The memory devices");

  RequestsInFlight requests((*cluster)->client(), std::vector(6, IdsRequest(prompt, 2000)));
  ASSERT_TRUE(requests.AwaitTokens(20, absl::Seconds(30))) << "the requests never got going";  // all rotating
  auto pid = (*cluster)->NodePid("compute-1");
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_EQ(::kill(static_cast<pid_t>(*pid), SIGKILL), 0);
  const absl::Time killed = absl::Now();
  const std::vector<Outcome> outcomes = requests.Join();
  for (int i = 0; i < 6; ++i) {
    ASSERT_FALSE(outcomes[i].status.ok()) << "request " << i << " outlived the compute node it ran through";
    EXPECT_EQ(outcomes[i].status.code(), absl::StatusCode::kUnavailable) << outcomes[i].status;
    EXPECT_NE(std::string(outcomes[i].status.message()).find("compute-1"), std::string::npos) << outcomes[i].status;
    EXPECT_LT(outcomes[i].ended - killed, absl::Seconds(10)) << "request " << i;
  }
  const absl::Time asked = absl::Now();
  const Outcome after = Generate((*cluster)->client(), IdsRequest(prompt, 8));
  EXPECT_EQ(after.status.code(), absl::StatusCode::kUnavailable) << after.status;
  EXPECT_LT(absl::Now() - asked, absl::Seconds(5));
}

// Under rotational pipelining, over two compute nodes and over three, a memory node's death fails
// only its sequences, promptly and naming it, as without rotation (ClusterTest.KillingAMemoryNode...):
// the compute node whose attention call failed closes its hand-over connections, so the other
// replicas' runners, waiting for its hand-overs, fail at once rather than at the step's timeout,
// and the step runs again without the dead node's sequences. Before, every request of the cluster
// failed after 30 s ("did not finish an iteration").
TEST(PipeliningTest, KillingAMemoryNodeUnderRotationFailsOnlyItsSequencesPromptly) {
  for (const int compute_nodes : {2, 3}) {  // over three, a failed step closes connections round the ring
    SCOPED_TRACE(absl::StrCat(compute_nodes, " compute nodes"));
    ClusterOptions options;
    options.max_migrations = 0;  // the blast radius, not the recomputation (failover_test)
    options.pipelining = "rotational";
    options.compute_nodes = compute_nodes;
    auto cluster = ClusterHarness::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    const KillTally tally = KillMidRunAndCheck(**cluster, "memory-1", "memory-1", absl::Seconds(5));
    EXPECT_GT(tally.failed, 0);
    EXPECT_GT(tally.succeeded, 0);
    if (::testing::Test::HasFailure()) {  // each compute node logs its failed steps
      for (int c = 0; c < compute_nodes; ++c) {
        const std::string node = absl::StrCat("compute-", c);
        std::printf("%s's log:\n%s\n", node.c_str(), (*cluster)->NodeLog(node).c_str());
      }
      return;
    }
  }
}

// `auto` on one compute node: one batch while few sequences run or wait, a second batch once
// more than `rotational_above` do; the outputs are the same either way.
TEST(PipeliningTest, AutoAddsTheSecondBatchOnlyAboveItsThreshold) {
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok()) << local.status();
  ClusterOptions options;
  options.pipelining = "auto";
  options.rotational_above = 6;
  options.max_batch = 16;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  // Watches the largest number of sequences each batch held.
  std::atomic<bool> done{false};
  std::mutex mu;
  std::vector<int64_t> most(2, 0);
  std::string mode;
  std::thread watcher([&] {
    while (!done) {
      auto status = (*cluster)->client().Status(absl::Seconds(1));
      if (status.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        mode = status->pipelining();
        for (int b = 0; b < status->running_per_batch_size() && b < 2; ++b) {
          most[b] = std::max(most[b], status->running_per_batch(b));
        }
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  auto run = [&](int count) {
    std::vector<lamina::v1::GenerateRequest> requests;
    std::vector<std::vector<int32_t>> expected;
    for (int i = 0; i < count; ++i) {
      const std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt(i % 2 ? "GPU memory" : "The KV cache");
      requests.push_back(IdsRequest(prompt, 40 + i));
      expected.push_back(SingleProcessIds(**local, prompt, 40 + i));
    }
    const std::vector<Outcome> outcomes = GenerateConcurrently((*cluster)->client(), requests);
    for (int i = 0; i < count; ++i) {
      ASSERT_TRUE(outcomes[i].status.ok()) << "request " << i << ": " << outcomes[i].status;
      EXPECT_EQ(outcomes[i].ids, expected[i]) << count << " requests, request " << i;
    }
  };
  run(4);  // at most 4 sequences: never above 6
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(mode, "auto");
    EXPECT_GT(most[0], 0);
    EXPECT_EQ(most[1], 0) << "the second batch took requests below the threshold";
  }
  run(14);  // 14 waiting at once: the second batch joins
  done = true;
  watcher.join();
  EXPECT_GT(most[1], 0) << "the second batch never ran above the threshold";
}

}  // namespace
}  // namespace lamina::testing

