#include "deploy/serve/serve_plan.h"

#include "common/model_config/model_config.h"
#include "common/topology/kv_dtype.h"
#include "common/topology/topology.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"
#include "tests/support/temp_dir.h"

namespace lamina::serve {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

ModelConfig Llama8bShape() {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(std::string(LAMINA_SOURCE_DIR) + "/deploy/models/llama-3.1-8b-shape");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

TEST(ServePlanTest, CountsALlamaModelsParameters) {
  EXPECT_EQ(ParameterCount(Llama8bShape()), 8030261248);  // Llama-3.1-8B's published count
}

TEST(ServePlanTest, AGpuPoolTakesWhatTheFractionLeavesAfterWeightsAndWorkspace) {
  const ModelConfig config = Llama8bShape();
  ServeOptions options;
  options.device = "cuda:0";
  options.max_batch = 1024;  // the pool's cap out of the way
  const DeviceMemoryBudget h200{141 * kGiB, 140 * kGiB};  // 1 GiB used by another process
  absl::StatusOr<int64_t> tokens = SizeKvPool(options, config, DType::kBF16, h200);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  const int64_t budget = static_cast<int64_t>(141 * kGiB * 0.9) - 1 * kGiB - ParameterCount(config) * 2 -
                         WorkspaceBytes(config, options.max_tokens_per_iteration, true);
  EXPECT_EQ(*tokens, budget / (128 * 1024));  // 128 KiB a token in bf16
  EXPECT_GT(*tokens, 700000);
  EXPECT_LT(*tokens, 900000);

  options.max_batch = 64;  // 64 full contexts of 131,072 tokens hold more than fits: no cap
  EXPECT_EQ(*SizeKvPool(options, config, DType::kBF16, h200), *tokens);
  options.max_batch = 2;  // but two hold less
  EXPECT_EQ(*SizeKvPool(options, config, DType::kBF16, h200), 2 * config.max_position_embeddings);
  options.kv_tokens = 12345;
  EXPECT_EQ(*SizeKvPool(options, config, DType::kBF16, h200), 12345);
}

TEST(ServePlanTest, TooLittleMemoryForOneContextSaysWhatIsMissing) {
  const ModelConfig config = Llama8bShape();
  ServeOptions options;
  options.device = "cuda:0";
  absl::StatusOr<int64_t> tokens = SizeKvPool(options, config, DType::kBF16, {24 * kGiB, 24 * kGiB});
  EXPECT_TRUE(absl::IsResourceExhausted(tokens.status())) << tokens.status();
  EXPECT_NE(tokens.status().message().find("too little memory for one full context of 131072 tokens"),
            std::string::npos)
      << tokens.status();
  EXPECT_NE(tokens.status().message().find("--memory-fraction"), std::string::npos);
}

TEST(ServePlanTest, TheTopologyParsesAsOneComputeNodeWithItsPool) {
  testing::TempDir dir;
  ServeOptions options;
  options.model_dir = testing::ModelDir("lamina-demo-6m");
  options.http_port = 18000;
  const std::string path = dir.Write("serve.yaml", ServeTopologyYaml(options, 4096));
  absl::StatusOr<Topology> topology = LoadTopology(path);
  ASSERT_TRUE(topology.ok()) << topology.status();
  ASSERT_EQ(topology->nodes.size(), 1u);
  EXPECT_EQ(topology->nodes[0].kind, NodeKind::kCompute);
  EXPECT_EQ(topology->nodes[0].kv_capacity_tokens, 4096);
  EXPECT_EQ(topology->coordinator_http_port, 18000);
  EXPECT_EQ(topology->coordinator_port, 50051);
}

TEST(ServePlanTest, ACpuMemoryNodeBesideThePoolComesWithBalancedPlacement) {
  testing::TempDir dir;
  ServeOptions options;
  options.model_dir = testing::ModelDir("lamina-demo-6m");
  options.cpu_kv_tokens = 20000;
  options.memory_node_port = 18071;
  absl::StatusOr<Topology> topology = LoadTopology(dir.Write("serve.yaml", ServeTopologyYaml(options, 4096)));
  ASSERT_TRUE(topology.ok()) << topology.status();
  ASSERT_EQ(topology->nodes.size(), 2u);
  EXPECT_EQ(topology->placement, "balanced");
  const NodeSpec* memory = topology->Find("memory-0");
  ASSERT_NE(memory, nullptr);
  EXPECT_EQ(memory->kind, NodeKind::kMemory);
  EXPECT_EQ(memory->device, "cpu");
  EXPECT_EQ(memory->kv_capacity_tokens, 20000);
  EXPECT_EQ(memory->data_address(), "127.0.0.1:18072");
  EXPECT_EQ(topology->Find("compute-0")->kv_capacity_tokens, 4096);
}

}  // namespace
}  // namespace lamina::serve
