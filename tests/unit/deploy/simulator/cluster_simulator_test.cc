#include "deploy/simulator/cluster_simulator.h"

#include "deploy/simulator/cost_model.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace lamina::simulator {
namespace {

std::vector<bench::BenchRequest> Requests(int count, int prompt, int output) {
  std::vector<bench::BenchRequest> requests(count);
  for (auto& r : requests) {
    r.prompt_ids.assign(prompt, 1);
    r.output_tokens = output;
  }
  return requests;
}

TEST(CostModelTest, FitRecoversKnownCosts) {
  CostModel truth;
  truth.step_fixed_ms = 2;
  truth.step_per_sequence_ms = 0.25;
  truth.attention_per_ktoken_ms = 7;
  truth.prefill_per_token_ms = 0.01;
  std::vector<CalibrationPoint> points;
  for (double batch : {2.0, 8.0, 30.0}) {
    for (double context : {64.0, 300.0}) {
      CalibrationPoint p{batch, context, batch * 3 + context / 10, 0, 0};
      p.iteration_ms = PredictIterationMs(truth, p);
      p.period_ms = p.iteration_ms + 0.5;
      points.push_back(p);
    }
  }
  absl::StatusOr<CostModel> fit = FitCostModel(points, 1, 1000, "test");
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->step_fixed_ms, 2, 1e-6);
  EXPECT_NEAR(fit->step_per_sequence_ms, 0.25, 1e-6);
  EXPECT_NEAR(fit->attention_per_ktoken_ms, 7, 1e-6);
  EXPECT_NEAR(fit->prefill_per_token_ms, 0.01, 1e-6);
  EXPECT_NEAR(fit->coordinator_ms, 0.5, 1e-9);
  EXPECT_FALSE(FitCostModel({points[0]}, 1, 1000, "test").ok());
}

TEST(CostModelTest, YamlRoundTrip) {
  CostModel c;
  c.step_fixed_ms = 1.5;
  c.attention_per_ktoken_ms = 3.25;
  c.coordinator_ms = 0.125;
  c.memory_nodes = 2;
  c.kv_capacity_tokens = 8192;
  c.chunked_prefill = false;
  c.batches = 2;
  c.more_batches_above = 80;
  testing::TempDir dir;
  absl::StatusOr<CostModel> back = LoadCostModel(dir.Write("c.yaml", CostModelToYaml(c)));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step_fixed_ms, 1.5);
  EXPECT_EQ(back->attention_per_ktoken_ms, 3.25);
  EXPECT_EQ(back->memory_nodes, 2);
  EXPECT_EQ(back->kv_capacity_tokens, 8192);
  EXPECT_FALSE(back->chunked_prefill);
  EXPECT_EQ(back->batches, 2);
  EXPECT_EQ(back->more_batches_above, 80);
  // Costs written before the batches were recorded load as one batch, always.
  absl::StatusOr<CostModel> old = LoadCostModel(dir.Write("old.yaml", "step_fixed_ms: 1\nstep_per_sequence_ms: 0\n"
                                                                    "attention_per_ktoken_ms: 0\nprefill_per_token_ms: 0\n"
                                                                    "coordinator_ms: 0\nmemory_nodes: 1\n"
                                                                    "kv_capacity_tokens: 100\n"));
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->batches, 1);
  EXPECT_EQ(old->more_batches_above, -1);
}

TEST(ClusterSimulatorTest, OneSequenceTakesOneIterationPerToken) {
  CostModel c;
  c.step_fixed_ms = 10;
  c.kv_capacity_tokens = 1000;
  bench::WorkloadSpec w;
  w.concurrency = 1;
  const SimulationResult r = Simulate(c, {1, 1, 8}, w, Requests(1, 5, 4));
  // A prefill iteration gives the first token, three decode iterations the rest: 40 ms.
  EXPECT_DOUBLE_EQ(r.wall_s, 0.040);
  EXPECT_EQ(r.output_tokens, 4);
  EXPECT_DOUBLE_EQ(r.ttft_ms.p50, 10);
  EXPECT_DOUBLE_EQ(r.tpot_ms.p50, 10);
  EXPECT_DOUBLE_EQ(r.compute_busy, 1.0);
}

// Costs measured with two batches in flight (pipelining): each batch runs its own iterations at
// the fitted cost, taking half of what runs or waits, so a closed loop of 8 goes through twice
// the tokens per second of one batch of 8 at the same iteration cost; under `auto` with 8 at most
// running or waiting (more_batches_above), the second batch takes nothing, as the scheduler's.
TEST(ClusterSimulatorTest, BatchesInFlightEachIterateOnTheirOwnShare) {
  CostModel c;
  c.step_fixed_ms = 10;
  c.kv_capacity_tokens = 1000;
  bench::WorkloadSpec w;
  w.concurrency = 8;
  const SimulationResult one = Simulate(c, {1, 1, 8}, w, Requests(8, 1, 10));
  c.batches = 2;
  const SimulationResult two = Simulate(c, {1, 1, 8}, w, Requests(8, 1, 10));
  // Each batch: a prefill iteration (no decodes), then nine decoding all its sequences.
  EXPECT_DOUBLE_EQ(one.mean_batch, 8 * 0.9);
  EXPECT_DOUBLE_EQ(two.mean_batch, 4 * 0.9);
  EXPECT_DOUBLE_EQ(one.wall_s, 0.100);  // 10 iterations of all 8
  EXPECT_DOUBLE_EQ(two.wall_s, 0.100);  // 10 iterations of each half, side by side
  EXPECT_DOUBLE_EQ(two.output_tokens_per_s, one.output_tokens_per_s);
  EXPECT_DOUBLE_EQ(two.compute_busy, 1.0);
  // 16 in flight with the batch limit at 8: one batch serves 8 at a time, two serve all 16.
  w.concurrency = 16;
  c.batches = 1;
  const SimulationResult limited = Simulate(c, {1, 1, 8}, w, Requests(16, 1, 10));
  c.batches = 2;
  const SimulationResult both = Simulate(c, {1, 1, 8}, w, Requests(16, 1, 10));
  EXPECT_DOUBLE_EQ(limited.wall_s, 0.200);
  EXPECT_DOUBLE_EQ(both.wall_s, 0.100);
  EXPECT_DOUBLE_EQ(both.output_tokens_per_s, 2 * limited.output_tokens_per_s);
  c.more_batches_above = 16;  // never more than 16 run or wait: the second batch stays empty
  const SimulationResult on_demand = Simulate(c, {1, 1, 8}, w, Requests(16, 1, 10));
  EXPECT_DOUBLE_EQ(on_demand.wall_s, 0.200);
  EXPECT_DOUBLE_EQ(on_demand.mean_batch, 8 * 0.9);
}

// As the scheduler does: a prompt longer than the token budget takes ceil(prompt / budget) prefill
// iterations before its first token with chunked prefill, and one without.
TEST(ClusterSimulatorTest, ChunkedPrefillSpreadsALongPromptOverIterations) {
  CostModel c;
  c.step_fixed_ms = 10;
  c.prefill_per_token_ms = 0.5;
  c.kv_capacity_tokens = 1000;
  c.max_tokens_per_iteration = 16;
  bench::WorkloadSpec w;
  w.concurrency = 1;
  const SimulationResult chunked = Simulate(c, {1, 1, 8}, w, Requests(1, 40, 4));
  // Chunks of 16, 16 and 8 tokens (18, 18 and 14 ms), then three decode iterations.
  EXPECT_DOUBLE_EQ(chunked.ttft_ms.p50, 50);
  EXPECT_DOUBLE_EQ(chunked.wall_s, 0.080);
  c.chunked_prefill = false;
  const SimulationResult whole = Simulate(c, {1, 1, 8}, w, Requests(1, 40, 4));
  EXPECT_DOUBLE_EQ(whole.ttft_ms.p50, 30);  // alone, the whole prompt in one iteration
  EXPECT_DOUBLE_EQ(whole.wall_s, 0.060);
  EXPECT_EQ(chunked.output_tokens, 4);
  EXPECT_EQ(whole.output_tokens, 4);
}

TEST(ClusterSimulatorTest, KvCapacityLimitsTheBatch) {
  CostModel c;
  c.step_fixed_ms = 1;
  c.kv_capacity_tokens = 20;  // one sequence of 10 + 10 at a time
  bench::WorkloadSpec w;
  w.concurrency = 4;
  const SimulationResult r = Simulate(c, {1, 1, 8}, w, Requests(4, 10, 10));
  EXPECT_EQ(r.output_tokens, 40);
  EXPECT_DOUBLE_EQ(r.wall_s, 0.040);  // the four run one after another, 10 iterations each
  EXPECT_NE(r.bottleneck.find("KV capacity"), std::string::npos) << r.bottleneck;
}

TEST(ClusterSimulatorTest, ReplicasScaleUntilTheCoordinatorSaturates) {
  CostModel c;
  c.step_fixed_ms = 10;
  c.coordinator_ms = 1;
  c.kv_capacity_tokens = 100000;
  bench::WorkloadSpec w;
  auto run = [&](int replicas) {
    w.concurrency = 8 * replicas;
    return Simulate(c, {replicas, 1, 8}, w, Requests(64 * replicas, 4, 16));
  };
  const SimulationResult one = run(1), four = run(4), forty = run(40);
  EXPECT_NEAR(four.output_tokens_per_s / one.output_tokens_per_s, 4, 0.2);
  // Each iteration needs 1 ms of the one coordinator: at most 1000 iterations/s of 8 sequences.
  EXPECT_LE(forty.output_tokens_per_s, 8000 * 1.01);
  EXPECT_NE(forty.bottleneck.find("coordinator"), std::string::npos) << forty.bottleneck;
}

}  // namespace
}  // namespace lamina::simulator
