#include "deploy/planner/analytic_model.h"

#include <string>

#include "common/model_config/model_config.h"
#include "deploy/planner/planner.h"
#include "gtest/gtest.h"

namespace lamina::planner {
namespace {

// The shipped Llama-3.1-8B-shaped model folder (Llama-3-8B has the same shape).
ModelConfig Llama3_8B() {
  absl::StatusOr<ModelConfig> c = LoadModelConfig(std::string(LAMINA_SOURCE_DIR) + "/deploy/models/llama-3.1-8b-shape");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig();
}

DeviceKind Device(const std::string& name, double gb, double gbs, double tflops, double link, double hourly) {
  DeviceKind d;
  d.name = name;
  d.memory_gb = gb;
  d.memory_bandwidth_gbs = gbs;
  d.bf16_tflops = tflops;
  d.link_gbs = link;
  d.hourly_usd = hourly;
  return d;
}

TEST(AnalyticModelTest, ShapeOfLlama3_8B) {
  const ModelShape m = ShapeOf(Llama3_8B());
  EXPECT_NEAR(m.params / 1e9, 8.03, 0.01);
  EXPECT_DOUBLE_EQ(m.kv_bytes_per_token(), 2.0 * 32 * 1024 * 2);  // k and v, 32 layers, 8 heads x 128, bf16
  EXPECT_DOUBLE_EQ(m.wire_bytes_per_token(), 32 * 2 * (2.0 * 4096 + 2.0 * 1024));
}

TEST(AnalyticModelTest, AFloat8KvPoolHoldsAboutTwiceTheTokensAndReadsAboutHalfTheBytes) {
  const ModelShape bf16 = ShapeOf(Llama3_8B());
  const ModelShape f8 = ShapeOf(Llama3_8B(), DType::kF8E4M3);
  // k and v, 32 layers, 8 heads x 128 one-byte codes and a float scale per head.
  EXPECT_DOUBLE_EQ(f8.kv_bytes_per_token(), 2.0 * 32 * (1024 + 8 * 4));
  EXPECT_DOUBLE_EQ(f8.weight_bytes(), bf16.weight_bytes());
  EXPECT_DOUBLE_EQ(f8.wire_bytes_per_token(), bf16.wire_bytes_per_token());
  const DeviceKind h100 = Device("h100", 80, 3350, 989, 50, 3.0);
  const DeviceKind h20 = Device("h20", 96, 4000, 148, 50, 1.3);
  Efficiency eff;
  const Prediction colocated = PredictBest(f8, 4096, {&h100, nullptr, 0, false}, eff, 100000, 0);
  const double kv_room = 80e9 * eff.memory_usable - f8.weight_bytes();
  EXPECT_EQ(colocated.batch, static_cast<int64_t>(kv_room / (4096 * f8.kv_bytes_per_token())));
  EXPECT_GT(colocated.batch, PredictBest(bf16, 4096, {&h100, nullptr, 0, false}, eff, 100000, 0).batch * 19 / 10);
  const Prediction step = PredictStep(f8, 4096, {&h100, &h20, 2, false}, eff, 256);
  const double kv_s = 256 * 4096 * 2.0 * 32 * (1024 + 8 * 4) / (2 * 4000e9 * eff.memory_bandwidth);
  EXPECT_NEAR(step.attention_s, kv_s, kv_s * 1e-12);
}

TEST(AnalyticModelTest, MinimumBandwidthIsThePapersFormulaForMultiHeadAttention) {
  ModelConfig c = Llama3_8B();
  c.num_kv_heads = 32;  // MHA: q, k, v and o are d values each
  const ModelShape m = ShapeOf(c);
  const double achieved = 0.5 * 989e12;
  const double paper = 2.0 * m.bytes_per_value * c.hidden_size * c.num_layers * achieved / m.matmul_params;
  EXPECT_NEAR(MinInterconnectBytesPerSecond(m, achieved), paper, paper * 1e-12);
}

TEST(AnalyticModelTest, StepTimesAddWithoutPipeliningAndOverlapWithIt) {
  const ModelShape m = ShapeOf(Llama3_8B());
  const DeviceKind h100 = Device("h100", 80, 3350, 989, 50, 3.0);
  const DeviceKind h20 = Device("h20", 96, 4000, 148, 50, 1.3);
  Efficiency eff;
  const Prediction serial = PredictStep(m, 4096, {&h100, &h20, 2, false}, eff, 256);
  const Prediction overlapped = PredictStep(m, 4096, {&h100, &h20, 2, true}, eff, 256);
  const double kv_s = 256 * 4096 * m.kv_bytes_per_token() / (2 * 4000e9 * eff.memory_bandwidth);
  EXPECT_NEAR(serial.attention_s, kv_s, kv_s * 1e-12);
  EXPECT_NEAR(serial.step_s, serial.compute_s + serial.attention_s + serial.link_s, 1e-15);
  EXPECT_NEAR(overlapped.step_s, std::max(serial.compute_s, serial.attention_s + serial.link_s), 1e-15);
  EXPECT_DOUBLE_EQ(serial.hourly_usd, 3.0 + 2 * 1.3);
  EXPECT_DOUBLE_EQ(serial.tokens_per_s, 256 / serial.step_s);
}

TEST(AnalyticModelTest, BatchIsCappedByKvCapacityAndLatencyTarget) {
  const ModelShape m = ShapeOf(Llama3_8B());
  const DeviceKind h100 = Device("h100", 80, 3350, 989, 50, 3.0);
  Efficiency eff;
  const Prediction colocated = PredictBest(m, 4096, {&h100, nullptr, 0, false}, eff, 100000, 0);
  const double kv_room = 80e9 * eff.memory_usable - m.weight_bytes();
  EXPECT_EQ(colocated.batch, static_cast<int64_t>(kv_room / (4096 * m.kv_bytes_per_token())));
  EXPECT_NE(colocated.bottleneck.find("KV capacity"), std::string::npos);
  const Prediction capped = PredictBest(m, 4096, {&h100, nullptr, 0, false}, eff, 100000, 0.020);
  EXPECT_LE(capped.step_s, 0.020);
  EXPECT_GT(PredictStep(m, 4096, {&h100, nullptr, 0, false}, eff, capped.batch + 1).step_s, 0.020);
  const DeviceKind tiny = Device("tiny", 8, 100, 10, 1, 0.1);
  EXPECT_FALSE(PredictBest(m, 4096, {&tiny, nullptr, 0, false}, eff, 64, 0).infeasible.empty());
}

TEST(AnalyticModelTest, LongContextsFavourOffloadingToCheapMemory) {
  const ModelShape m = ShapeOf(Llama3_8B());
  const DeviceKind h100 = Device("h100", 80, 3350, 989, 50, 3.0);
  const DeviceKind h20 = Device("h20", 96, 4000, 148, 50, 1.3);
  Efficiency eff;
  const int n = BestMemoryDevices(m, 8192, h100, h20, 1.3 / 3.0, eff, 4096, 0, /*pipelined=*/true);
  ASSERT_GE(n, 1);
  const Prediction offloaded = PredictBest(m, 8192, {&h100, &h20, n, true}, eff, 4096, 0);
  const Prediction colocated = PredictBest(m, 8192, {&h100, nullptr, 0, false}, eff, 4096, 0);
  EXPECT_GT(offloaded.tokens_per_s_per_usd_hour, colocated.tokens_per_s_per_usd_hour);
  // One more or one fewer device is no better.
  for (int other : {n - 1, n + 1}) {
    if (other < 1) continue;
    EXPECT_LE(PredictBest(m, 8192, {&h100, &h20, other, true}, eff, 4096, 0).tokens_per_s_per_usd_hour,
              offloaded.tokens_per_s_per_usd_hour);
  }
  // When memory devices cost as much as compute devices, fewer of them pay.
  EXPECT_LE(BestMemoryDevices(m, 8192, h100, h20, 1.0, eff, 4096, 0, true), n);
}

TEST(AnalyticModelTest, BalancedMemoryDevicesIsTheFewestWhoseAttentionHidesBehindCompute) {
  const ModelShape m = ShapeOf(Llama3_8B());
  const DeviceKind h100 = Device("h100", 80, 3350, 989, 50, 3.0);
  const DeviceKind small = Device("small", 24, 1000, 80, 50, 0.5);  // little memory, slow to read it
  Efficiency eff;
  const double context = 2304;
  const int n = BalancedMemoryDevices(m, context, h100, small, eff, 4096, 0);
  ASSERT_GT(n, 1);
  const auto step = [&](int devices) { return PredictBest(m, context, {&h100, &small, devices, true}, eff, 4096, 0); };
  const Prediction at = step(n), below = step(n - 1);
  EXPECT_LE(at.attention_s + at.link_s, at.compute_s);
  EXPECT_GT(below.attention_s + below.link_s, below.compute_s);
  // Through the planner, on the pipelined design of that pair.
  PriceTable table;
  table.devices["h100"] = h100;
  table.devices["small"] = small;
  PlanOptions options;
  options.pipelined = true;
  options.compute_kinds = {"h100"};
  options.memory_kinds = {"small"};
  bool seen = false;
  for (const Prediction& p : Plan(m, context, table, options)) {
    if (p.design.memory == nullptr) continue;
    EXPECT_EQ(p.balanced_memory_devices, n);
    seen = true;
  }
  EXPECT_TRUE(seen);
  // A link too slow for any count to keep up.
  DeviceKind slow_link = h100;
  slow_link.link_gbs = 0.01;
  EXPECT_EQ(BalancedMemoryDevices(m, context, slow_link, small, eff, 4096, 0, 16), 0);
}

TEST(PlannerTest, RanksFeasibleDesignsByTokensPerDollar) {
  PriceTable table;
  table.devices["h100"] = Device("h100", 80, 3350, 989, 50, 3.0);
  table.devices["h20"] = Device("h20", 96, 4000, 148, 50, 1.3);
  table.devices["tiny"] = Device("tiny", 8, 100, 10, 1, 0.1);
  PlanOptions options;
  options.pipelined = true;
  const std::vector<Prediction> ranked = Plan(ShapeOf(Llama3_8B()), 8192, table, options);
  ASSERT_GE(ranked.size(), 3u);
  for (size_t i = 1; i < ranked.size(); ++i) {
    if (!ranked[i].infeasible.empty()) continue;
    EXPECT_GE(ranked[i - 1].tokens_per_s_per_usd_hour, ranked[i].tokens_per_s_per_usd_hour);
  }
  // 8 GB cannot hold the weights: "tiny" comes as groups, three devices as a layer split, four (the
  // fewest that divide 32 heads, 8 KV heads, the MLP and the vocabulary) tensor-parallel.
  for (const Prediction& p : ranked) {
    if (p.design.compute->name != "tiny") continue;
    EXPECT_EQ(p.design.compute_devices, p.design.tensor_parallel ? 4 : 3) << p.design.Name();
  }
}

TEST(PlannerTest, AModelLargerThanOneDeviceIsPlannedAsAGroupOfThem) {
  // Llama-3.1-70B's shape: 141 GB of bf16 weights, more than one H100 (80 GB) holds.
  absl::StatusOr<ModelConfig> c =
      LoadModelConfig(std::string(LAMINA_SOURCE_DIR) + "/deploy/models/llama-3.1-70b-shape");
  ASSERT_TRUE(c.ok()) << c.status();
  const ModelShape m = ShapeOf(*c);
  EXPECT_NEAR(m.weight_bytes() / 1e9, 141.1, 0.1);
  const DeviceKind h100 = Device("h100", 80, 3350, 989, 50, 3.0);
  const Efficiency eff;
  EXPECT_EQ(ComputeDevicesFor(m, h100, eff), 2);  // 141.1 GB within 2 x 72 GB usable
  EXPECT_EQ(ComputeDevicesFor(m, h100, eff, /*most=*/1), 0);

  // A group of two prices and holds as two; 64 sequences in flight run as two batches of 32, each
  // step one device's rates doubled on 32 rows, and each sequence waits two such steps a token.
  const DeviceKind h20 = Device("h20", 96, 4000, 148, 50, 1.3);
  Design split{&h100, &h20, 2, false};
  split.compute_devices = 2;
  EXPECT_EQ(split.Name(), "2 x h100 (layer split) + 2 x h20");
  const Prediction p = PredictStep(m, 2048, split, eff, 64);
  EXPECT_DOUBLE_EQ(p.hourly_usd, 2 * 3.0 + 2 * 1.3);
  EXPECT_NEAR(p.compute_s, 2 * m.weight_bytes() / (2 * 3350e9 * eff.memory_bandwidth), 1e-12);  // weight reads
  EXPECT_NEAR(p.tokens_per_s, 64 / p.step_s, 1e-9);
  Design one{&h100, &h20, 2, false};  // what one device (were it large enough) would do with 32 rows
  const Prediction half = PredictStep(m, 2048, one, eff, 32);
  EXPECT_NEAR(p.attention_s, 2 * half.attention_s, 1e-12);
  Design colocated{&h100, nullptr, 0, false};
  colocated.compute_devices = 2;
  EXPECT_EQ(PredictBest(m, 2048, colocated, eff, 4096, 0).infeasible, "a layer split keeps its KV caches on memory nodes");
  EXPECT_NE(PredictBest(m, 2048, {&h100, &h20, 2, false}, eff, 4096, 0).infeasible.find("do not fit one h100"),
            std::string::npos);

  // A tensor-parallel pair instead: one batch on the doubled rates, plus two ring all-reduces of
  // [64, 8192] bf16 rows a layer over the 50 GB/s link, with the KV in its own pools.
  Design group{&h100, nullptr, 0, false};
  group.compute_devices = 2;
  group.tensor_parallel = true;
  EXPECT_EQ(group.Name(), "2 x h100 (tensor parallel) (colocated)");
  const Prediction tp = PredictStep(m, 2048, group, eff, 64);
  const double weights = m.weight_bytes() / (2 * 3350e9 * eff.memory_bandwidth);
  const double all_reduce = 2.0 * (2 - 1) / 2 * 64 * 8192 * 2 / (50e9 * eff.link) + eff.layer_latency_us * 1e-6;
  EXPECT_NEAR(tp.compute_s, weights + 80 * 2 * all_reduce, 1e-12);
  EXPECT_TRUE(PredictBest(m, 2048, group, eff, 4096, 0).infeasible.empty());
  // Its KV on two memory devices instead: the same compute, the attention and link the memory
  // devices'; one batch, so not pipelined.
  Design offloaded_group = group;
  offloaded_group.memory = &h20;
  offloaded_group.memory_devices = 2;
  EXPECT_EQ(offloaded_group.Name(), "2 x h100 (tensor parallel) + 2 x h20");
  const Prediction tp_offloaded = PredictStep(m, 2048, offloaded_group, eff, 64);
  EXPECT_NEAR(tp_offloaded.compute_s, tp.compute_s, 1e-12);
  EXPECT_NEAR(tp_offloaded.step_s, tp_offloaded.compute_s + tp_offloaded.attention_s + tp_offloaded.link_s, 1e-12);
  EXPECT_DOUBLE_EQ(tp_offloaded.hourly_usd, 2 * 3.0 + 2 * 1.3);
  EXPECT_TRUE(PredictBest(m, 2048, offloaded_group, eff, 4096, 0).infeasible.empty());
  offloaded_group.pipelined = true;
  EXPECT_EQ(PredictBest(m, 2048, offloaded_group, eff, 4096, 0).infeasible,
            "a tensor-parallel group runs one batch (no pipelining over memory nodes)");

  // `lamina plan` ranks such designs rather than finding none: tensor-parallel groups colocated and
  // offloaded, layer splits offloaded.
  PriceTable table;
  table.devices["h100"] = h100;
  table.devices["h20"] = h20;
  const std::vector<Prediction> ranked = Plan(m, 2048, table, PlanOptions{});
  ASSERT_FALSE(ranked.empty());
  EXPECT_TRUE(ranked[0].infeasible.empty()) << ranked[0].infeasible;
  bool tensor_parallel = false, tensor_parallel_offloaded = false, layer_split = false;
  for (const Prediction& p : ranked) {
    if (!p.infeasible.empty()) continue;
    EXPECT_GT(p.design.compute_devices, 1) << p.design.Name();
    EXPECT_GT(p.tokens_per_s, 0);
    tensor_parallel |= p.design.tensor_parallel && p.design.memory == nullptr;
    tensor_parallel_offloaded |= p.design.tensor_parallel && p.design.memory != nullptr && !p.design.pipelined;
    layer_split |= !p.design.tensor_parallel && p.design.memory != nullptr;
  }
  EXPECT_TRUE(tensor_parallel);
  EXPECT_TRUE(tensor_parallel_offloaded);
  EXPECT_TRUE(layer_split);
}

}  // namespace
}  // namespace lamina::planner
