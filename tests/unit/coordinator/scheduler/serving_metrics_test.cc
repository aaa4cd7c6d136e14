#include "coordinator/scheduler/serving_metrics.h"

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(ServingMetricsTest, RecordsWhatRequestsWentThrough) {
  ServingMetrics metrics;
  metrics.Refused(absl::StatusCode::kInvalidArgument);
  metrics.Admitted(absl::Milliseconds(3), 100, 64);
  metrics.Admitted(absl::Milliseconds(40), 20, 0);
  metrics.Token(absl::Milliseconds(50), std::nullopt);  // a request's first token
  metrics.Token(std::nullopt, absl::Microseconds(7500));
  metrics.Token(std::nullopt, std::nullopt);  // a fork's first token
  metrics.SampleFinished("length");
  metrics.SampleFinished("stop");
  metrics.RequestEnded(absl::StatusCode::kOk, absl::Milliseconds(200), 100, 3);
  metrics.RequestEnded(absl::StatusCode::kCancelled, absl::Seconds(2), 20, 0);

  const ServingMetrics::Snapshot s = metrics.Read();
  EXPECT_EQ(s.prompt_tokens, 120);
  EXPECT_EQ(s.cached_prompt_tokens, 64);
  EXPECT_EQ(s.generated_tokens, 3);
  EXPECT_EQ(s.requests, (std::map<std::string, int64_t>{{"CANCELLED", 1}, {"INVALID_ARGUMENT", 1}, {"OK", 1}}));
  EXPECT_EQ(s.samples, (std::map<std::string, int64_t>{{"length", 1}, {"stop", 1}}));
  EXPECT_EQ(s.queue_time.count(), 2);
  EXPECT_DOUBLE_EQ(s.queue_time.sum(), 0.043);
  EXPECT_EQ(s.time_to_first_token.count(), 1);
  EXPECT_DOUBLE_EQ(s.time_to_first_token.sum(), 0.05);
  ASSERT_EQ(s.inter_token_latency.count(), 1);
  // 7.5 ms is a bound: it counts in that bound's bucket.
  const std::vector<double>& bounds = s.inter_token_latency.bounds();
  const size_t at = std::find(bounds.begin(), bounds.end(), 0.0075) - bounds.begin();
  ASSERT_LT(at, bounds.size());
  EXPECT_EQ(s.inter_token_latency.buckets()[at], 1);
  EXPECT_EQ(s.request_latency.count(), 2) << "refusals are not accepted requests";
  EXPECT_DOUBLE_EQ(s.request_latency.sum(), 2.2);
  EXPECT_DOUBLE_EQ(s.request_prompt_tokens.sum(), 120);
  EXPECT_DOUBLE_EQ(s.request_generation_tokens.sum(), 3);
}

TEST(ServingMetricsTest, MovesOffFailedNodesAreCountedWithThoseRefused) {
  ServingMetrics metrics;
  metrics.Migration(true);
  metrics.Migration(true);
  metrics.Migration(false);
  EXPECT_EQ(metrics.Read().migrations, 2);
  EXPECT_EQ(metrics.Read().migrations_refused, 1);
}

TEST(ServingMetricsTest, ASnapshotIsACopy) {
  ServingMetrics metrics;
  const ServingMetrics::Snapshot before = metrics.Read();
  metrics.Token(absl::Seconds(1), std::nullopt);
  EXPECT_EQ(before.generated_tokens, 0);
  EXPECT_EQ(before.time_to_first_token.count(), 0);
  EXPECT_EQ(metrics.Read().generated_tokens, 1);
}

}  // namespace
}  // namespace lamina
