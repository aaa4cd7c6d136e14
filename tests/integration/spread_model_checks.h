// Checks the tests of a model spread over several compute processes share (layer splits,
// tensor-parallel groups): every process takes part in serving, a process whose death no request
// can outlive fails every request promptly, and a dead memory node ends only its own sequences.
#ifndef LAMINA_TESTS_INTEGRATION_SPREAD_MODEL_CHECKS_H_
#define LAMINA_TESTS_INTEGRATION_SPREAD_MODEL_CHECKS_H_

#include <signal.h>

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/requests_in_flight.h"

namespace lamina::testing {

struct SpreadServed {
  std::vector<std::vector<int32_t>> ids;  // each request's tokens, in order
  int compute_processes = 0;              // compute processes `lamina status` listed
  int memory_nodes_attending = 0;         // memory nodes that attended rows
};

// Starts a cluster of `options`, serves `requests` concurrently (each must succeed), and expects
// every compute process to have run plans by a heartbeat past the last step.
inline SpreadServed ServeOnEveryComputeProcess(const ClusterOptions& options,
                                               const std::vector<lamina::v1::GenerateRequest>& requests) {
  SpreadServed served;
  auto cluster = ClusterHarness::Start(options);
  if (!cluster.ok()) {
    ADD_FAILURE() << cluster.status();
    return served;
  }
  const std::vector<Outcome> outcomes = GenerateConcurrently((*cluster)->client(), requests);
  for (size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_TRUE(outcomes[i].status.ok()) << "request " << i << ": " << outcomes[i].status;
    served.ids.push_back(outcomes[i].ids);
  }
  absl::SleepFor(absl::Milliseconds(300));  // a heartbeat past the last step
  auto status = (*cluster)->client().Status(absl::Seconds(5));
  EXPECT_TRUE(status.ok()) << status.status();
  if (status.ok()) {
    for (const auto& node : status->nodes()) {
      if (node.role() == lamina::v1::NODE_ROLE_MEMORY && node.load().attended_rows() > 0) {
        ++served.memory_nodes_attending;
      }
      if (node.role() != lamina::v1::NODE_ROLE_COMPUTE) continue;
      ++served.compute_processes;
      EXPECT_GT(node.load().busy_count(), 0) << node.name() << " ran no plan";
    }
  }
  return served;
}

// Sends `count` greedy requests of `prompt` (600 tokens each), kills node `victim` once they are
// under way, and expects each to fail UNAVAILABLE naming `named` within 10 s of the kill.
inline void ExpectKillingFailsEveryRequest(ClusterHarness& cluster, const std::vector<int32_t>& prompt, int count,
                                           const std::string& victim, const std::string& named) {
  RequestsInFlight requests(cluster.client(), std::vector(count, IdsRequest(prompt, 600)));
  ASSERT_TRUE(requests.AwaitTokens(10, absl::Seconds(30))) << "the requests never got going";
  auto pid = cluster.NodePid(victim);
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_EQ(::kill(static_cast<pid_t>(*pid), SIGKILL), 0);
  const absl::Time killed = absl::Now();
  for (const Outcome& outcome : requests.Join()) {
    ASSERT_FALSE(outcome.status.ok()) << "a request outlived " << victim;
    EXPECT_EQ(outcome.status.code(), absl::StatusCode::kUnavailable) << outcome.status;
    EXPECT_NE(std::string(outcome.status.message()).find(named), std::string::npos) << outcome.status;
    EXPECT_LT(outcome.ended - killed, absl::Seconds(10));
  }
}

// Sends `count` greedy requests of `prompt` (600 tokens each, single-process mode's being
// `expected`), kills memory-1 once it holds some of them, and expects only its sequences to end:
// each fails UNAVAILABLE naming it, every other request gives `expected`, at least
// `least_surviving` of them.
inline void ExpectKillingMemoryOneEndsOnlyItsSequences(ClusterHarness& cluster, const std::vector<int32_t>& prompt,
                                                       const std::vector<int32_t>& expected, int count,
                                                       int least_surviving) {
  RequestsInFlight requests(cluster.client(), std::vector(count, IdsRequest(prompt, 600)));
  ASSERT_TRUE(requests.AwaitTokens(20, absl::Seconds(30))) << "the requests never got going";
  int64_t held = 0;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10); held == 0 && absl::Now() < deadline;) {
    auto status = cluster.client().Status(absl::Seconds(1));
    if (status.ok()) {
      for (const auto& node : status->nodes()) {
        if (node.name() == "memory-1") held = node.num_sequences();
      }
    }
    if (held == 0) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GT(held, 0) << "memory-1 never held a sequence";
  auto pid = cluster.NodePid("memory-1");
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_EQ(::kill(static_cast<pid_t>(*pid), SIGKILL), 0);
  int failed = 0, succeeded = 0;
  for (const Outcome& outcome : requests.Join()) {
    if (outcome.status.ok()) {
      ++succeeded;
      EXPECT_EQ(outcome.ids, expected) << "a survivor's output must be unaffected";
    } else {
      ++failed;
      EXPECT_EQ(outcome.status.code(), absl::StatusCode::kUnavailable) << outcome.status;
      EXPECT_NE(std::string(outcome.status.message()).find("memory-1"), std::string::npos) << outcome.status;
    }
  }
  EXPECT_GE(succeeded, least_surviving);
  EXPECT_GT(failed, 0);
}

}  // namespace lamina::testing

#endif  // LAMINA_TESTS_INTEGRATION_SPREAD_MODEL_CHECKS_H_
