#include "deploy/bench/bench_report.h"

#include "gtest/gtest.h"

namespace lamina::bench {
namespace {

TEST(BenchReportTest, NearestRankPercentiles) {
  std::vector<double> values;
  for (int i = 100; i >= 1; --i) values.push_back(i);
  const Percentiles p = Summarize(values);
  EXPECT_EQ(p.p50, 50);
  EXPECT_EQ(p.p90, 90);
  EXPECT_EQ(p.p99, 99);
  EXPECT_DOUBLE_EQ(p.mean, 50.5);
}

lamina::v1::ClusterStatusResponse Status(double clock, double busy, int64_t iterations, int64_t decoded, int used) {
  lamina::v1::ClusterStatusResponse s;
  s.set_iterations(iterations);
  s.set_decoded_sequences(decoded);
  auto* compute = s.add_nodes();
  compute->set_name("c");
  compute->set_role(lamina::v1::NODE_ROLE_COMPUTE);
  compute->mutable_load()->set_clock_seconds(clock);
  compute->mutable_load()->set_busy_seconds(busy);
  compute->mutable_load()->set_round_trip_seconds(busy / 10);
  compute->mutable_load()->set_round_trips(iterations * 4);
  auto* memory = s.add_nodes();
  memory->set_name("m");
  memory->set_role(lamina::v1::NODE_ROLE_MEMORY);
  memory->set_kv_capacity_slots(100);
  memory->set_kv_used_slots(used);
  memory->mutable_load()->set_clock_seconds(clock);
  return s;
}

TEST(BenchReportTest, FiguresFromRecordsAndStatus) {
  WorkloadSpec spec;
  spec.ttft_target_ms = 150;
  spec.tpot_target_ms = 20;
  std::vector<RequestRecord> records(3);
  // 11 tokens: first at 0.1 s, last at 0.3 s -> TPOT 20 ms; meets both targets.
  records[0] = {0.0, 0.1, 0.3, 5, 11, absl::OkStatus()};
  // TTFT 200 ms: misses the TTFT target.
  records[1] = {0.0, 0.2, 0.4, 7, 11, absl::OkStatus()};
  records[2] = {0.1, -1, 0.5, 0, 0, absl::UnavailableError("node down")};
  const auto before = Status(10, 1, 100, 400, 0);
  const auto after = Status(12, 2.5, 120, 500, 0);
  const std::vector<lamina::v1::ClusterStatusResponse> samples = {Status(11, 2, 110, 450, 20),
                                                                  Status(11.5, 2, 115, 480, 60)};
  const BenchReport r = MakeReport(spec, records, before, after, samples, /*hourly_usd=*/2.0);
  EXPECT_EQ(r.requests, 3);
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.first_error, "node down");
  EXPECT_DOUBLE_EQ(r.wall_s, 0.5);
  EXPECT_EQ(r.input_tokens, 12);
  EXPECT_EQ(r.output_tokens, 22);
  EXPECT_DOUBLE_EQ(r.output_tokens_per_s, 44);
  EXPECT_NEAR(r.ttft_ms.p50, 100, 1e-9);
  EXPECT_NEAR(r.tpot_ms.p50, 20, 1e-9);
  EXPECT_EQ(r.met_targets, 1);
  EXPECT_DOUBLE_EQ(r.goodput_tokens_per_s, 22);
  EXPECT_DOUBLE_EQ(r.mean_batch, 5);        // 100 sequences over 20 iterations
  EXPECT_DOUBLE_EQ(r.iterations_per_s, 40);
  EXPECT_NEAR(r.round_trip_us, 1e6 * 0.15 / 80, 1e-6);
  ASSERT_EQ(r.nodes.size(), 2u);
  EXPECT_DOUBLE_EQ(r.nodes[0].busy_fraction, 0.75);  // 1.5 s busy over 2 s
  EXPECT_DOUBLE_EQ(r.nodes[1].kv_occupancy_mean, 0.4);
  EXPECT_DOUBLE_EQ(r.nodes[1].kv_occupancy_peak, 0.6);
  EXPECT_DOUBLE_EQ(r.tokens_per_s_per_usd_hour, 22);
  const nlohmann::json json = ReportToJson(r);
  EXPECT_EQ(json["output_tokens"], 22);
  EXPECT_EQ(json["nodes"][1]["role"], "memory");
}

}  // namespace
}  // namespace lamina::bench
