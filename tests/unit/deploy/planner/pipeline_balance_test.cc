#include "deploy/planner/pipeline_balance.h"

#include "gtest/gtest.h"

namespace lamina::planner {
namespace {

// A cluster of one compute node that ran `plans` plans, computing `computing_s` and waiting
// `waiting_s` on attention in all, with `memory` healthy memory nodes and `batches` batches.
lamina::v1::ClusterStatusResponse Status(int batches, int64_t plans, double computing_s, double waiting_s,
                                         int memory) {
  lamina::v1::ClusterStatusResponse s;
  for (int b = 0; b < batches; ++b) s.add_running_per_batch(3);
  auto* compute = s.add_nodes();
  compute->set_role(lamina::v1::NODE_ROLE_COMPUTE);
  compute->mutable_load()->set_busy_count(plans);
  compute->mutable_load()->set_busy_seconds(computing_s);
  compute->mutable_load()->set_round_trip_seconds(waiting_s);
  for (int m = 0; m < memory; ++m) {
    auto* node = s.add_nodes();
    node->set_role(lamina::v1::NODE_ROLE_MEMORY);
    node->set_healthy(true);
  }
  auto* dead = s.add_nodes();  // not counted
  dead->set_role(lamina::v1::NODE_ROLE_MEMORY);
  dead->set_healthy(false);
  return s;
}

TEST(PipelineBalanceTest, AttentionLongerThanComputeAsksForMoreMemoryNodes) {
  // 100 plans: 3 ms computing and 7.5 ms waiting each, 2 memory nodes: 2 x 7.5 / 3 = 5 needed.
  std::optional<PipelineBalance> b = MeasureBalance(Status(2, 100, 0.3, 0.75, 2));
  ASSERT_TRUE(b.has_value());
  EXPECT_DOUBLE_EQ(b->compute_ms, 3.0);
  EXPECT_DOUBLE_EQ(b->attention_ms, 7.5);
  EXPECT_EQ(b->memory_nodes, 2);
  EXPECT_EQ(b->memory_nodes_needed, 5);
  EXPECT_FALSE(b->balanced());
  EXPECT_EQ(b->Describe(),
            "pipeline balance: a plan computes 3.00 ms and waits 7.50 ms on attention: attention should take at "
            "most 3.00 ms for 2 batches to overlap; about 5 memory nodes would (2 now)");
}

TEST(PipelineBalanceTest, AttentionWithinComputeIsBalanced) {
  std::optional<PipelineBalance> b = MeasureBalance(Status(2, 10, 0.05, 0.03, 2));
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->memory_nodes_needed, 2);  // 2 x 3 / 5 = 1.2, rounded up
  EXPECT_TRUE(b->balanced());
  EXPECT_EQ(b->Describe(),
            "pipeline balance: a plan computes 5.00 ms and waits 3.00 ms on attention: the 2 memory nodes keep up");
}

TEST(PipelineBalanceTest, NothingToJudgeWithOneBatchFixedPipeliningOrNoPlans) {
  EXPECT_FALSE(MeasureBalance(Status(1, 100, 0.3, 0.75, 2)).has_value());
  EXPECT_FALSE(MeasureBalance(Status(2, 0, 0, 0, 2)).has_value());
  lamina::v1::ClusterStatusResponse fixed = Status(2, 100, 0.3, 0.75, 2);
  fixed.add_nodes()->set_role(lamina::v1::NODE_ROLE_COMPUTE);  // two compute nodes, a batch each
  EXPECT_FALSE(MeasureBalance(fixed).has_value());
}

}  // namespace
}  // namespace lamina::planner
