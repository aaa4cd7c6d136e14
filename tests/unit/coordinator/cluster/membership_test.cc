// Membership: the serving listener follows registrations and deaths as they happen, and load
// reports turn into the recent rates `balanced` placement sizes memory nodes' shares by.
#include "coordinator/cluster/membership.h"

#include <string>
#include <vector>

#include "common/topology/topology.h"
#include "gtest/gtest.h"

namespace lamina {
namespace {

// The shipped demo topology: compute-0 (with a pool of its own), memory-0 and memory-1.
Topology Demo() {
  absl::StatusOr<Topology> topology = LoadTopology(std::string(LAMINA_SOURCE_DIR) + "/deploy/topologies/local-cpu.yaml");
  EXPECT_TRUE(topology.ok()) << topology.status();
  return *topology;
}

lamina::v1::RegisterRequest Registration(const std::string& name, lamina::v1::NodeRole role) {
  lamina::v1::RegisterRequest request;
  request.set_name(name);
  request.set_role(role);
  request.set_kv_capacity_slots(1024);
  return request;
}

lamina::v1::HeartbeatRequest Report(const std::string& name, double busy_s, int64_t count, double attention_s,
                                    int64_t rows) {
  lamina::v1::HeartbeatRequest heartbeat;
  heartbeat.set_name(name);
  heartbeat.mutable_load()->set_busy_seconds(busy_s);
  heartbeat.mutable_load()->set_busy_count(count);
  heartbeat.mutable_load()->set_attention_seconds(attention_s);
  heartbeat.mutable_load()->set_attended_rows(rows);
  return heartbeat;
}

const MemberInfo& Find(const std::vector<MemberInfo>& members, const std::string& name) {
  for (const MemberInfo& m : members) {
    if (m.spec.name == name) return m;
  }
  ADD_FAILURE() << name;
  return members.front();
}

TEST(MembershipTest, TheServingListenerHearsOfEveryChangeBeforeTheCallReturns) {
  Membership membership(Demo(), nullptr);
  std::vector<bool> heard;
  membership.SetServingListener([&](bool serving) { heard.push_back(serving); });
  EXPECT_EQ(heard, std::vector<bool>({false}));  // nothing registered yet
  ASSERT_TRUE(membership.Register(Registration("compute-0", lamina::v1::NODE_ROLE_COMPUTE)).ok());
  EXPECT_EQ(heard, std::vector<bool>({false, true}));  // its own pool serves
  membership.MarkDead("compute-0", "killed by the test");
  EXPECT_EQ(heard, std::vector<bool>({false, true, false}));
  EXPECT_FALSE(membership.Register(Registration("compute-9", lamina::v1::NODE_ROLE_COMPUTE)).ok());
  EXPECT_EQ(heard.size(), 3u);  // a refused registration changes nothing
  membership.SetServingListener(nullptr);
  ASSERT_TRUE(membership.Register(Registration("compute-0", lamina::v1::NODE_ROLE_COMPUTE)).ok());
  EXPECT_EQ(heard.size(), 3u);
}

TEST(MembershipTest, LoadReportsBecomeRecentRatesPerRowAndPerStep) {
  Membership membership(Demo(), nullptr);
  ASSERT_TRUE(membership.Register(Registration("compute-0", lamina::v1::NODE_ROLE_COMPUTE)).ok());
  ASSERT_TRUE(membership.Register(Registration("memory-0", lamina::v1::NODE_ROLE_MEMORY)).ok());
  EXPECT_EQ(Find(membership.Snapshot(), "memory-0").row_attention_seconds, 0);  // unknown yet

  // 100 rows in 0.02 s: 200 us a row; then 100 in 0.04 s: the average moves halfway, to 300 us.
  ASSERT_TRUE(membership.Heartbeat(Report("memory-0", 0.05, 10, 0.02, 100)));
  EXPECT_DOUBLE_EQ(Find(membership.Snapshot(), "memory-0").row_attention_seconds, 0.0002);
  ASSERT_TRUE(membership.Heartbeat(Report("memory-0", 0.10, 20, 0.06, 200)));
  EXPECT_DOUBLE_EQ(Find(membership.Snapshot(), "memory-0").row_attention_seconds, 0.0003);
  ASSERT_TRUE(membership.Heartbeat(Report("memory-0", 0.10, 20, 0.06, 200)));  // idle: unchanged
  EXPECT_DOUBLE_EQ(Find(membership.Snapshot(), "memory-0").row_attention_seconds, 0.0003);
  EXPECT_EQ(Find(membership.Snapshot(), "memory-0").step_compute_seconds, 0);  // not a compute node

  // 4 steps in 0.2 s: 50 ms a step.
  ASSERT_TRUE(membership.Heartbeat(Report("compute-0", 0.2, 4, 0, 0)));
  EXPECT_DOUBLE_EQ(Find(membership.Snapshot(), "compute-0").step_compute_seconds, 0.05);
}

}  // namespace
}  // namespace lamina
