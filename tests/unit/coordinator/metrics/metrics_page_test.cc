#include "coordinator/metrics/metrics_page.h"

#include "gtest/gtest.h"
#include "tests/support/prometheus_page.h"

namespace lamina {
namespace {

MemberInfo Member(const std::string& name, NodeKind kind, bool registered) {
  MemberInfo m;
  m.spec.name = name;
  m.spec.kind = kind;
  m.registered = registered;
  return m;
}

MetricsPageInputs SomeCluster() {
  MetricsPageInputs in;
  in.model = "lamina-demo-6m";
  in.pipelining = "rotational";
  in.now = absl::FromUnixSeconds(1000);
  MemberInfo compute = Member("compute-0", NodeKind::kCompute, true);
  compute.last_heard = in.now - absl::Milliseconds(250);
  compute.load.set_clock_seconds(60);
  compute.load.set_busy_seconds(12.5);
  compute.load.set_round_trips(3200);
  compute.load.set_round_trip_seconds(0.32);
  MemberInfo memory = Member("memory-0", NodeKind::kMemory, true);
  memory.last_heard = in.now - absl::Seconds(1);
  memory.kv_capacity_slots = 1000;
  memory.kv_free_slots = 400;
  memory.kv_shared_slots = 16;
  memory.num_sequences = 3;
  MemberInfo dead = Member("memory-1", NodeKind::kMemory, true);
  dead.dead = true;
  dead.kv_capacity_slots = 500;
  dead.kv_free_slots = 500;
  in.members = {compute, memory, dead, Member("memory-2", NodeKind::kMemory, false)};
  in.scheduler.queued = 2;
  in.scheduler.running = 5;
  in.scheduler.running_per_batch = {3, 2};
  in.scheduler.preemptions = 1;
  in.scheduler.iterations = 10;
  in.scheduler.iteration_seconds = 0.75;
  in.scheduler.prefilled_tokens = 300;
  in.scheduler.decoded_sequences = 40;
  in.serving.requests = {{"OK", 7}, {"UNAVAILABLE", 2}};
  in.serving.samples = {{"length", 6}, {"stop", 3}};
  in.serving.prompt_tokens = 400;
  in.serving.cached_prompt_tokens = 128;
  in.serving.generated_tokens = 90;
  in.serving.migrations = 4;
  in.serving.migrations_refused = 1;
  in.serving.time_to_first_token.Observe(0.004);
  in.serving.time_to_first_token.Observe(0.2);
  return in;
}

TEST(MetricsPageTest, ReportsTheCoordinatorAndEachNode) {
  const std::string page = RenderMetricsPage(SomeCluster());
  absl::StatusOr<std::map<std::string, double>> parsed = testing::ParsePrometheusPage(page);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << page;
  const std::map<std::string, double> expected = {
      {R"(lamina_info{model="lamina-demo-6m",pipelining="rotational"})", 1},
      {"lamina_requests_waiting", 2},
      {"lamina_sequences_running", 5},
      {R"(lamina_batch_sequences{batch="0"})", 3},
      {R"(lamina_batch_sequences{batch="1"})", 2},
      {R"(lamina_requests_total{status="OK"})", 7},
      {R"(lamina_requests_total{status="UNAVAILABLE"})", 2},
      {R"(lamina_sequences_finished_total{reason="length"})", 6},
      {R"(lamina_sequences_finished_total{reason="stop"})", 3},
      {"lamina_prompt_tokens_total", 400},
      {"lamina_prompt_tokens_cached_total", 128},
      {"lamina_prefill_tokens_total", 300},
      {"lamina_generation_tokens_total", 90},
      {"lamina_preemptions_total", 1},
      {"lamina_migrations_total", 4},
      {"lamina_migrations_refused_total", 1},
      {"lamina_iterations_total", 10},
      {"lamina_iteration_seconds_total", 0.75},
      {"lamina_decoded_sequences_total", 40},
      {R"(lamina_time_to_first_token_seconds_bucket{le="0.0025"})", 0},
      {R"(lamina_time_to_first_token_seconds_bucket{le="0.005"})", 1},
      {R"(lamina_time_to_first_token_seconds_bucket{le="0.2"})", 2},
      {R"(lamina_time_to_first_token_seconds_bucket{le="+Inf"})", 2},
      {"lamina_time_to_first_token_seconds_sum", 0.204},
      {"lamina_time_to_first_token_seconds_count", 2},
      {"lamina_request_latency_seconds_count", 0},
      {R"(lamina_node_up{node="compute-0",role="compute"})", 1},
      {R"(lamina_node_up{node="memory-0",role="memory"})", 1},
      {R"(lamina_node_up{node="memory-1",role="memory"})", 0},
      {R"(lamina_node_up{node="memory-2",role="memory"})", 0},
      {R"(lamina_node_heartbeat_age_seconds{node="compute-0"})", 0.25},
      {R"(lamina_node_heartbeat_age_seconds{node="memory-0"})", 1},
      {R"(lamina_kv_slots_capacity{node="memory-0"})", 1000},
      {R"(lamina_kv_slots_used{node="memory-0"})", 600},
      {R"(lamina_kv_slots_shared{node="memory-0"})", 16},
      {R"(lamina_node_sequences{node="memory-0"})", 3},
      {R"(lamina_kv_slots_used{node="memory-1"})", 0},
      {R"(lamina_node_uptime_seconds{node="compute-0"})", 60},
      {R"(lamina_node_busy_seconds_total{node="compute-0"})", 12.5},
      {R"(lamina_node_round_trips_total{node="compute-0"})", 3200},
      {R"(lamina_node_round_trip_seconds_total{node="compute-0"})", 0.32},
  };
  for (const auto& [series, value] : expected) {
    auto it = parsed->find(series);
    ASSERT_NE(it, parsed->end()) << series << " is missing from\n" << page;
    EXPECT_DOUBLE_EQ(it->second, value) << series;
  }
  // A node that never registered has no figures beyond being down; round trips are compute nodes'.
  for (const char* absent :
       {R"(lamina_kv_slots_capacity{node="memory-2"})", R"(lamina_node_heartbeat_age_seconds{node="memory-2"})",
        R"(lamina_node_round_trips_total{node="memory-0"})", R"(lamina_kv_slots_used{node="compute-0"})"}) {
    EXPECT_EQ(parsed->count(absent), 0u) << absent;
  }
}

TEST(MetricsPageTest, AnEmptyClusterStillGivesEveryFamily) {
  MetricsPageInputs in;
  in.model = "m";
  in.pipelining = "none";
  const std::string page = RenderMetricsPage(in);
  absl::StatusOr<std::map<std::string, double>> parsed = testing::ParsePrometheusPage(page);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  for (const char* family : {"lamina_requests_total", "lamina_node_up", "lamina_kv_slots_used",
                             "lamina_inter_token_latency_seconds", "lamina_request_generation_tokens"}) {
    EXPECT_NE(page.find(absl::StrCat("# TYPE ", family, " ")), std::string::npos) << family;
  }
  EXPECT_EQ(parsed->at("lamina_generation_tokens_total"), 0);
  EXPECT_EQ(parsed->at(R"(lamina_inter_token_latency_seconds_bucket{le="+Inf"})"), 0);
}

}  // namespace
}  // namespace lamina
