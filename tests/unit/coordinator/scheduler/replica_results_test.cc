// MergeReplicaResults: which replica's answer a rotating batch's step takes. A broken stream comes
// before a report of unreachable memory nodes (which may follow from it), that before other
// failures, and a step that succeeded everywhere takes the tokens of the replica that ran the
// last slice.
#include "coordinator/scheduler/replica_results.h"

#include "gtest/gtest.h"

namespace lamina {
namespace {

using Results = std::vector<absl::StatusOr<lamina::v1::StepResult>>;

lamina::v1::StepResult Tokens(int32_t token) {
  lamina::v1::StepResult r;
  r.add_tokens()->set_token(token);
  return r;
}

lamina::v1::StepResult Failed(const std::string& message, const std::string& memory_node = "") {
  lamina::v1::StepResult r;
  r.set_error_code(static_cast<int32_t>(absl::StatusCode::kDeadlineExceeded));
  r.set_error_message(message);
  if (!memory_node.empty()) r.add_failed_memory_nodes()->set_name(memory_node);
  return r;
}

TEST(ReplicaResultsTest, OneComputeNodeAnswersAlone) {
  auto merged = MergeReplicaResults(Results{Tokens(7)}, /*last_replica=*/-1);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->tokens(0).token(), 7);
}

TEST(ReplicaResultsTest, TheReplicaThatRanTheLastSliceGivesTheTokens) {
  const Results results = {Tokens(100), Tokens(101), Tokens(102)};
  EXPECT_EQ(MergeReplicaResults(results, 2)->tokens(0).token(), 102);
  EXPECT_EQ(MergeReplicaResults(results, 0)->tokens(0).token(), 100);
}

TEST(ReplicaResultsTest, ABrokenStreamComesBeforeMemoryNodesReportedUnreachable) {
  // compute-1 died: its stream broke, and compute-0's waits on it gave up, so compute-0 reports
  // the memory nodes it was waiting with as unreachable. The broken stream is the cause.
  const Results results = {Failed("q/k/v did not arrive", "memory-0"),
                           absl::UnavailableError("compute node 'compute-1': stream closed")};
  auto merged = MergeReplicaResults(results, 0);
  ASSERT_FALSE(merged.ok());
  EXPECT_NE(merged.status().message().find("compute-1"), std::string::npos) << merged.status();
}

TEST(ReplicaResultsTest, UnreachableMemoryNodesComeBeforeOtherFailures) {
  const Results results = {Failed("out of memory"), Failed("memory node unreachable", "memory-1")};
  auto merged = MergeReplicaResults(results, 0);
  ASSERT_TRUE(merged.ok()) << merged.status();
  ASSERT_EQ(merged->failed_memory_nodes_size(), 1);
  EXPECT_EQ(merged->failed_memory_nodes(0).name(), "memory-1");

  auto other = MergeReplicaResults(Results{Tokens(1), Failed("out of memory")}, 0);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->error_message(), "out of memory") << "a failure anywhere fails the step";
}

TEST(ReplicaResultsTest, NoResultsOrTooFewAreInternalErrors) {
  EXPECT_EQ(MergeReplicaResults(Results{}, -1).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(MergeReplicaResults(Results{Tokens(1)}, 2).status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace lamina
