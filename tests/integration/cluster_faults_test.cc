// The cluster under faults and pressure: a memory node killed or hung, a compute node hung, more
// requests than the pools hold. Real processes on loopback, as cluster_test.cc runs them.
#include <signal.h>

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/transport/transport.h"
#include "coordinator/embedded/local_cluster.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "lamina/v1/generation.grpc.pb.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/requests_in_flight.h"
#include "tests/integration/single_process.h"
#include "tests/support/golden.h"

namespace lamina::testing {
namespace {

// With no moves allowed (failover_test has them recomputed), a dead memory node fails only its
// sequences; `lamina up` restarts it.
TEST(ClusterTest, KillingAMemoryNodeFailsOnlyItsSequencesAndTheSurvivorServesNewRequests) {
  ClusterOptions options;
  options.max_migrations = 0;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok());
  const std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt("The memory devices");
  const std::vector<int32_t> expected = SingleProcessIds(**local, prompt, 600);

  RequestsInFlight requests((*cluster)->client(), std::vector(8, IdsRequest(prompt, 600)));
  ASSERT_TRUE(requests.AwaitTokens(20, absl::Seconds(30))) << "the requests never got going";  // mid-run
  auto pid = (*cluster)->NodePid("memory-1");
  ASSERT_TRUE(pid.ok()) << pid.status();
  const absl::Time killed = absl::Now();
  ASSERT_EQ(::kill(static_cast<pid_t>(*pid), SIGKILL), 0);
  const std::vector<Outcome> outcomes = requests.Join();

  int failed = 0, succeeded = 0;
  for (int i = 0; i < 8; ++i) {
    if (outcomes[i].status.ok()) {
      ++succeeded;
      EXPECT_EQ(outcomes[i].ids, expected) << "a survivor's output must be unaffected";
    } else {
      ++failed;
      EXPECT_EQ(outcomes[i].status.code(), absl::StatusCode::kUnavailable) << outcomes[i].status;
      EXPECT_NE(std::string(outcomes[i].status.message()).find("memory-1"), std::string::npos) << outcomes[i].status;
      EXPECT_LT(outcomes[i].ended - killed, absl::Seconds(5)) << "failed requests must end within a few seconds";
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(succeeded, 0);

  Outcome after = Generate((*cluster)->client(), IdsRequest(prompt, 16));
  ASSERT_TRUE(after.status.ok()) << after.status;
  EXPECT_EQ(after.ids, std::vector<int32_t>(expected.begin(), expected.begin() + 16));
  auto status = (*cluster)->client().Status(absl::Seconds(1));
  ASSERT_TRUE(status.ok());
  for (const auto& n : status->nodes()) {
    if (n.name() == "memory-1") {
      // Dead, or already restarted; whoever noticed first (the compute node or the heartbeat), the
      // reason is this node's own.
      EXPECT_EQ(n.detail().find("memory-0"), std::string::npos) << n.detail();
    } else {
      EXPECT_TRUE(n.healthy()) << n.name() << ": " << n.detail();
    }
  }
  EXPECT_NE((*cluster)->UpOutput().find(absl::StrCat("memory-1 (pid ", *pid, ") was killed by signal 9")),
            std::string::npos)
      << "lamina up reports the dead daemon:\n" << (*cluster)->UpOutput();
  EXPECT_NE((*cluster)->UpOutput().find("restarting memory-1"), std::string::npos) << (*cluster)->UpOutput();
}

TEST(ClusterTest, RequestsBeyondCapacityQueueAndCompleteAndImpossibleOnesAreRefused) {
  // Two memory nodes of 200 slots; each request needs prompt + 60 slots, so three fit per node.
  ClusterOptions options;
  options.kv_capacity_tokens = 200;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok());
  const std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt("FlashAttention");
  const std::vector<int32_t> expected = SingleProcessIds(**local, prompt, 60);

  const std::vector<Outcome> outcomes =
      GenerateConcurrently((*cluster)->client(), std::vector<lamina::v1::GenerateRequest>(16, IdsRequest(prompt, 60)));
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << i << ": " << outcomes[i].status;
    EXPECT_EQ(outcomes[i].ids, expected);
  }

  const absl::Time start = absl::Now();
  Outcome too_big = Generate((*cluster)->client(), IdsRequest(prompt, 300));
  EXPECT_EQ(too_big.status.code(), absl::StatusCode::kResourceExhausted) << too_big.status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "refused at once, not after waiting";

  Outcome too_long = Generate((*cluster)->client(), IdsRequest(std::vector<int32_t>(1100, 40), 4));
  EXPECT_EQ(too_long.status.code(), absl::StatusCode::kInvalidArgument) << too_long.status;
  EXPECT_NE(std::string(too_long.status.message()).find("1100 tokens"), std::string::npos);
}

TEST(ClusterTest, UnderMemoryPressurePreemptedRequestsCompleteWithIdenticalOutputs) {
  // Eight requests of up to 155 tokens each on a node of 240 slots: each fits alone, together
  // they run the pool dry, so the youngest are preempted and recomputed later. With two batches
  // in flight a batch can preempt only its own requests (the other's step is running), down to
  // none while the other batch holds the node.
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok());
  const std::vector<std::string> texts = {"The memory devices", "FlashAttention", "We", "GPU memory"};
  std::vector<lamina::v1::GenerateRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 8; ++i) {
    const std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt(texts[i % texts.size()]);
    lamina::v1::GenerateRequest r = IdsRequest(prompt, 150);
    GenerationRequest single;
    single.prompt = prompt;
    single.max_tokens = 150;
    single.ignore_eos = true;
    if (i >= 6) {  // sampled: a recomputed sequence must draw what it would have drawn
      r.mutable_sampling()->set_temperature(1.0f);
      r.mutable_sampling()->set_seed(100 + i);
      single.sampling = {1.0f, 0, 1.0f, static_cast<uint64_t>(100 + i)};
    }
    std::vector<int32_t> ids;
    ASSERT_TRUE((*local)->Generate({&single, 1}, [&](const TokenEvent& e) { ids.push_back(e.token); }).ok());
    requests.push_back(r);
    expected.push_back(ids);
  }
  // "chunks": one batch with a 32-token budget, so that resumed samples (prompt and output
  // recomputed) are prefilled in chunks.
  for (const std::string mode : {"none", "rotational", "chunks"}) {
    ClusterOptions options;
    options.memory_nodes = 1;
    options.kv_capacity_tokens = 240;
    options.pipelining = mode == "chunks" ? "none" : mode;
    if (mode == "chunks") options.max_tokens_per_iteration = 32;
    auto cluster = ClusterHarness::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    std::vector<Outcome> outcomes = GenerateConcurrently((*cluster)->client(), requests);
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(outcomes[i].status.ok()) << mode << " " << i << ": " << outcomes[i].status;
      EXPECT_EQ(outcomes[i].ids, expected[i]) << mode << " request " << i;
    }
    auto status = (*cluster)->client().Status(absl::Seconds(1));
    ASSERT_TRUE(status.ok());
    EXPECT_GT(status->preemptions(), 0) << mode << ": the pool never ran dry: the test does not test preemption";
    EXPECT_EQ(status->completed(), 8) << mode;
  }
}

TEST(ClusterTest, AHungComputeNodeEndsItsRequestsAndTheClusterRecoversWhenItComesBack) {
  auto cluster = ClusterHarness::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto pid = (*cluster)->NodePid("compute-0");
  ASSERT_TRUE(pid.ok()) << pid.status();
  const std::vector<int32_t> prompt = {1021, 841, 68, 391, 697};
  RequestsInFlight requests((*cluster)->client(), std::vector(4, IdsRequest(prompt, 900)));
  ASSERT_TRUE(requests.AwaitTokens(20, absl::Seconds(30))) << "the requests never got going";
  const absl::Time stopped = absl::Now();
  ASSERT_EQ(::kill(static_cast<pid_t>(*pid), SIGSTOP), 0);  // hung, not dead: its sockets stay open
  for (const Outcome& o : requests.Join()) {
    EXPECT_EQ(o.status.code(), absl::StatusCode::kUnavailable) << o.status;
    EXPECT_LT(o.ended - stopped, absl::Seconds(6)) << "no request waits forever on a hung node";
  }
  ASSERT_EQ(::kill(static_cast<pid_t>(*pid), SIGCONT), 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  Outcome after;
  do {
    absl::SleepFor(absl::Milliseconds(200));
    after = Generate((*cluster)->client(), IdsRequest(prompt, 8));
  } while (!after.status.ok() && absl::Now() < deadline);
  ASSERT_TRUE(after.status.ok()) << "the node re-registers and serves again: " << after.status;
  EXPECT_EQ(after.ids.size(), 8u);
  // Nothing the interrupted step left behind stays allocated.
  absl::Time settle = absl::Now() + absl::Seconds(3);
  int64_t used = -1;
  while (absl::Now() < settle) {
    auto status = (*cluster)->client().Status(absl::Seconds(1));
    used = 0;
    for (const auto& n : status->nodes()) used += n.kv_used_slots();
    if (used == 0) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(used, 0);
}

// A memory node hung past the heartbeat timeout is declared dead and its requests fail; when it
// resumes it registers again, and what it held then (its requests' slots, any cached prefixes) is
// freed there rather than left allocated for good.
TEST(ClusterTest, AHungMemoryNodeComesBackWithNothingOfItsFailedRequestsAllocated) {
  ClusterOptions options;
  options.max_migrations = 0;  // its requests fail rather than move (failover_test)
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto pid = (*cluster)->NodePid("memory-1");
  ASSERT_TRUE(pid.ok()) << pid.status();
  const std::vector<int32_t> prompt = {1021, 841, 68, 391, 697};
  RequestsInFlight requests((*cluster)->client(), std::vector(8, IdsRequest(prompt, 600)));
  ASSERT_TRUE(requests.AwaitTokens(20, absl::Seconds(30))) << "the requests never got going";
  ASSERT_EQ(::kill(static_cast<pid_t>(*pid), SIGSTOP), 0);  // hung, not dead: its sockets stay open
  absl::SleepFor(absl::Seconds(3));                          // past the 1.5 s heartbeat timeout
  ASSERT_EQ(::kill(static_cast<pid_t>(*pid), SIGCONT), 0);
  int failed = 0;
  for (const Outcome& o : requests.Join()) {
    if (o.status.ok()) continue;
    ++failed;
    EXPECT_EQ(o.status.code(), absl::StatusCode::kUnavailable) << o.status;
    EXPECT_NE(std::string(o.status.message()).find("memory-1"), std::string::npos) << o.status;
  }
  EXPECT_GT(failed, 0) << "memory-1 held some of the requests";

  // memory-1 registers again, and ends up holding nothing.
  int64_t held = -1;
  bool healthy = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline) {
    auto status = (*cluster)->client().Status(absl::Seconds(1));
    ASSERT_TRUE(status.ok()) << status.status();
    for (const auto& n : status->nodes()) {
      if (n.name() != "memory-1") continue;
      healthy = n.healthy();
      held = n.kv_used_slots();
    }
    if (healthy && held == 0) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(healthy) << "memory-1 registers again once it resumes";
  EXPECT_EQ(held, 0) << "the slots of memory-1's failed requests stay allocated there";
  Outcome after = Generate((*cluster)->client(), IdsRequest(prompt, 8));
  EXPECT_TRUE(after.status.ok()) << after.status;
}

// What OpenAI's HTTP API refuses, gRPC refuses too, before tokenizing anything; the cluster then
// serves as before.

}  // namespace
}  // namespace lamina::testing
