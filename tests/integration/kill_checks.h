// A check several cluster tests share: a node whose death no request can outlive (a node of a layer
// split, a rank of a tensor-parallel group, with nowhere to recompute) is killed mid-run, and every
// request must end UNAVAILABLE naming what died, promptly.
#ifndef LAMINA_TESTS_INTEGRATION_KILL_CHECKS_H_
#define LAMINA_TESTS_INTEGRATION_KILL_CHECKS_H_

#include <signal.h>

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/requests_in_flight.h"

namespace lamina::testing {

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

}  // namespace lamina::testing

#endif  // LAMINA_TESTS_INTEGRATION_KILL_CHECKS_H_
