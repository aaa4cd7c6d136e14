// No request lost: a cluster under load whose nodes die, hang or are told to stop. Requests on a
// failed memory node, or in the batch of a failed compute node, are recomputed on the survivors
// and finish with the outputs of a fault-free run; SIGTERM drains; `lamina up` restarts a dead
// coordinator; random faults end every request exactly once.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/embedded/local_cluster.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/requests_in_flight.h"
#include "tests/integration/single_process.h"
#include "tests/support/golden.h"

namespace lamina::testing {
namespace {

// Requests of 40 to 240 tokens from the demo's prompts, and their fault-free outputs.
struct Load {
  std::vector<lamina::v1::GenerateRequest> requests;
  std::vector<std::vector<int32_t>> expected;
};

Load MakeLoad(int count, int longest = 240) {
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  EXPECT_TRUE(local.ok()) << local.status();
  const std::vector<std::string> texts = {"Attention offloading", "The memory devices", "FlashAttention",
                                          "In this paper, we", "We", "The KV cache", "Decode attention is",
                                          "GPU memory"};
  Load load;
  for (int i = 0; i < count; ++i) {
    const std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt(texts[i % texts.size()]);
    const int max_tokens = 40 + (i * 37) % (longest - 39);
    load.requests.push_back(IdsRequest(prompt, max_tokens));
    load.expected.push_back(SingleProcessIds(**local, prompt, max_tokens));
  }
  return load;
}

void ExpectAllMatch(const Load& load, const std::vector<Outcome>& outcomes) {
  for (size_t i = 0; i < outcomes.size(); ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << "request " << i << ": " << outcomes[i].status;
    EXPECT_EQ(outcomes[i].ids, load.expected[i]) << "request " << i << " repeated, skipped or changed a token";
  }
}

int64_t KvUsed(ClusterHarness& cluster) {
  auto status = cluster.client().Status(absl::Seconds(2));
  if (!status.ok()) return -1;
  int64_t used = 0;
  for (const auto& n : status->nodes()) used += n.kv_used_slots();
  return used;
}

TEST(FailoverTest, AKilledMemoryNodesRequestsAreRecomputedOnTheSurvivor) {
  auto cluster = ClusterHarness::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const Load load = MakeLoad(32);
  RequestsInFlight requests((*cluster)->client(), load.requests);
  ASSERT_TRUE(requests.AwaitTokens(10, absl::Seconds(30))) << "the requests never got going";
  auto pid = (*cluster)->NodePid("memory-1");
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_EQ(::kill(static_cast<pid_t>(*pid), SIGKILL), 0);
  ExpectAllMatch(load, requests.Join());
  EXPECT_NE((*cluster)->UpOutput().find("restarting memory-1"), std::string::npos) << (*cluster)->UpOutput();
  EXPECT_NE((*cluster)->NodeLog("coordinator").find("moves off 'memory-1'"), std::string::npos);
}

TEST(FailoverTest, AHungMemoryNodesRequestsAreRecomputedOnceItIsDeclaredDead) {
  auto cluster = ClusterHarness::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const Load load = MakeLoad(32);
  RequestsInFlight requests((*cluster)->client(), load.requests);
  ASSERT_TRUE(requests.AwaitTokens(10, absl::Seconds(30))) << "the requests never got going";
  auto pid = (*cluster)->NodePid("memory-0");
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_EQ(::kill(static_cast<pid_t>(*pid), SIGSTOP), 0);  // past the 1.5 s heartbeat timeout
  // Declared dead, the node leaves the cluster degraded, still serving.
  lamina::v1::HealthResponse::Status health = lamina::v1::HealthResponse::SERVING;
  for (const absl::Time until = absl::Now() + absl::Seconds(5); absl::Now() < until;) {
    auto answer = (*cluster)->client().Health(absl::Seconds(1));
    if (answer.ok() && (health = answer->status()) == lamina::v1::HealthResponse::DEGRADED) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(health, lamina::v1::HealthResponse::DEGRADED);
  const std::vector<Outcome> outcomes = requests.Join();
  ::kill(static_cast<pid_t>(*pid), SIGCONT);
  ExpectAllMatch(load, outcomes);
  // Back from its stop, the node registers again and what it held is freed there.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (KvUsed(**cluster) != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(KvUsed(**cluster), 0) << "a node's slots leaked";
}

TEST(FailoverTest, AKilledComputeNodesBatchMovesToTheOtherUnderFixedPipelining) {
  ClusterOptions options;
  options.compute_nodes = 2;
  options.pipelining = "fixed";
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const Load load = MakeLoad(24);
  RequestsInFlight requests((*cluster)->client(), load.requests);
  ASSERT_TRUE(requests.AwaitTokens(10, absl::Seconds(30))) << "the requests never got going";
  auto pid = (*cluster)->NodePid("compute-1");
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_EQ(::kill(static_cast<pid_t>(*pid), SIGKILL), 0);
  ExpectAllMatch(load, requests.Join());
}

TEST(FailoverTest, SigtermDrainsTheRequestsInFlightAndAdmitsNoMore) {
  ClusterOptions options;
  options.shutdown_grace_s = 60;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const Load load = MakeLoad(8);
  RequestsInFlight requests((*cluster)->client(), load.requests);
  ASSERT_TRUE(requests.AwaitTokens(5, absl::Seconds(30))) << "the requests never got going";
  (*cluster)->SignalUp(SIGTERM);
  // The coordinator stops admitting at once; the requests in flight go on.
  absl::SleepFor(absl::Milliseconds(300));
  const Outcome late = Generate((*cluster)->client(), load.requests[0]);
  EXPECT_FALSE(late.status.ok()) << "a request sent after SIGTERM was admitted";
  ExpectAllMatch(load, requests.Join());
  absl::StatusOr<int> exited = (*cluster)->WaitForUp(absl::Seconds(30));
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_NE((*cluster)->NodeLog("coordinator").find("every request in flight finished"), std::string::npos)
      << (*cluster)->NodeLog("coordinator");
}

TEST(FailoverTest, ADeadCoordinatorIsRestartedAndTheNodesFreeWhatItsRequestsHeld) {
  auto cluster = ClusterHarness::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const Load load = MakeLoad(8);
  RequestsInFlight requests((*cluster)->client(), load.requests);
  ASSERT_TRUE(requests.AwaitTokens(5, absl::Seconds(30))) << "the requests never got going";
  absl::StatusOr<pid_t> coordinator = (*cluster)->CoordinatorPid();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const absl::Time killed = absl::Now();
  ASSERT_EQ(::kill(*coordinator, SIGKILL), 0);
  for (const Outcome& outcome : requests.Join()) EXPECT_FALSE(outcome.status.ok()) << "its coordinator died";

  // Serving again within 10 s, with the same outputs; the old coordinator's sequences freed.
  Outcome again;
  while (absl::Now() - killed < absl::Seconds(10)) {
    again = Generate((*cluster)->client(), load.requests[1]);
    if (again.status.ok()) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_TRUE(again.status.ok()) << "not serving 10 s after the coordinator died: " << again.status;
  EXPECT_EQ(again.ids, load.expected[1]);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (KvUsed(**cluster) != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(KvUsed(**cluster), 0) << "the nodes kept what the dead coordinator's requests held";
  EXPECT_NE((*cluster)->UpOutput().find("restarted coordinator"), std::string::npos) << (*cluster)->UpOutput();
}

// Random kills and stops of memory nodes over 200 requests: every request ends once, those that
// complete with the fault-free outputs, the others with an error after a prefix of them.
TEST(FailoverTest, RandomFaultsEndEveryRequestExactlyOnce) {
  ClusterOptions options;
  options.memory_nodes = 3;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const Load load = MakeLoad(200, 240);
  std::atomic<bool> done{false};
  std::map<std::string, int> faults;
  std::thread chaos([&] {
    std::mt19937 random(20261201);
    absl::SleepFor(absl::Milliseconds(300));
    // At most a dozen faults, however long the requests take (a slow machine would otherwise
    // fault each request more often than max_migrations allows).
    for (int fault = 0; !done && fault < 12; ++fault) {
      const std::string node = absl::StrCat("memory-", random() % 3);
      auto pid = (*cluster)->NodePid(node);
      if (pid.ok() && *pid > 0) {
        if (fault % 2 == 0) {  // kills and stops in turn, on nodes picked at random
          ::kill(static_cast<pid_t>(*pid), SIGKILL);
          ++faults["killed"];
        } else {
          ::kill(static_cast<pid_t>(*pid), SIGSTOP);
          absl::SleepFor(absl::Milliseconds(1800));  // past the heartbeat timeout
          ::kill(static_cast<pid_t>(*pid), SIGCONT);
          ++faults["stopped"];
        }
      }
      absl::SleepFor(absl::Milliseconds(700));
    }
  });
  int completed = 0, failed = 0;
  for (size_t first = 0; first < load.requests.size(); first += 50) {
    const std::vector<lamina::v1::GenerateRequest> wave(load.requests.begin() + first,
                                                        load.requests.begin() + first + 50);
    const std::vector<Outcome> outcomes = GenerateConcurrently((*cluster)->client(), wave);
    for (size_t i = 0; i < outcomes.size(); ++i) {
      const std::vector<int32_t>& want = load.expected[first + i];
      if (outcomes[i].status.ok()) {
        ++completed;
        EXPECT_EQ(outcomes[i].ids, want) << "request " << first + i;
      } else {
        ++failed;
        EXPECT_EQ(outcomes[i].status.code(), absl::StatusCode::kUnavailable) << outcomes[i].status;
        ASSERT_LE(outcomes[i].ids.size(), want.size());
        EXPECT_TRUE(std::equal(outcomes[i].ids.begin(), outcomes[i].ids.end(), want.begin()))
            << "request " << first + i << " streamed tokens of another output before failing";
      }
    }
  }
  done = true;
  chaos.join();
  std::printf("random faults: %d memory nodes killed, %d stopped; 200 requests: %d completed, %d failed\n",
              faults["killed"], faults["stopped"], completed, failed);
  EXPECT_EQ(completed + failed, 200);
  EXPECT_GT(faults["killed"], 0);
  EXPECT_GT(faults["stopped"], 0);
  EXPECT_GE(completed, 180) << "most requests should survive the faults by moving";
}

}  // namespace
}  // namespace lamina::testing
