// A compute node's attention split by place: sequences in its own pool and on a memory node (over
// tcp) in one step give exactly the logits of the engine with every sequence in one in-process
// pool, and a memory node that goes away fails only the steps that reach it.
#include "compute_node/local/placed_attention.h"

#include <memory>
#include <mutex>
#include <vector>

#include "compute_node/engine/compute_engine.h"
#include "gtest/gtest.h"
#include "kv/attention/attention_executor.h"
#include "memory_node/data_plane/attention_server.h"
#include "tests/support/golden.h"

namespace lamina {
namespace {

class PlacedAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto weights = ModelWeights::Load(testing::ModelDir("tiny-llama3"));
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = std::move(*weights);
    const ModelConfig& c = weights_->config;
    options_ = {c.num_layers, 1024, {c.num_q_heads, c.num_kv_heads, c.head_dim, 0}};
    auto pool = LocalPool::Create(options_);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    auto executor = AttentionExecutor::Create(options_);
    ASSERT_TRUE(executor.ok());
    memory_node_ = std::move(*executor);
    transport_ = MakeTcpTransport();
    const AttentionWireShape shape{c.num_layers, c.q_size(), c.kv_size()};
    auto server = AttentionServer::Start(transport_.get(), "127.0.0.1:0", shape, memory_node_.get(), &memory_mu_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    remote_ = std::make_unique<RemoteAttention>(
        transport_.get(), std::map<std::string, std::string>{{"memory-0", server_->address()}}, shape,
        absl::Seconds(5));
    auto placed = PlacedAttention::Create(pool_.get(), "compute-0", remote_.get());
    ASSERT_TRUE(placed.ok()) << placed.status();
    placed_ = std::move(*placed);
  }

  std::vector<std::vector<int32_t>> GoldenPrompts() {
    testing::GoldenTensors golden("tiny-llama3");
    std::vector<std::vector<int32_t>> prompts;
    for (int p = 0; p < 3; ++p) prompts.push_back(golden.Ids("prompt_" + std::to_string(p) + ".ids"));
    return prompts;
  }

  std::unique_ptr<ModelWeights> weights_;
  AttentionExecutorOptions options_;
  std::unique_ptr<LocalPool> pool_;
  std::unique_ptr<AttentionExecutor> memory_node_;
  std::mutex memory_mu_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<AttentionServer> server_;
  std::unique_ptr<RemoteAttention> remote_;
  std::unique_ptr<PlacedAttention> placed_;
};

TEST_F(PlacedAttentionTest, AStepMixingLocalAndRemoteSequencesGivesTheInProcessLogitsExactly) {
  auto reference_pool = AttentionExecutor::Create(options_);
  ASSERT_TRUE(reference_pool.ok());
  ComputeEngine reference(weights_.get(), reference_pool->get());
  ComputeEngine placed(weights_.get(), placed_.get());
  // Sequences 0 and 2 in the node's own pool, 1 on the memory node.
  ASSERT_TRUE(placed_->Assign(0, "compute-0").ok());
  ASSERT_TRUE(placed_->Assign(1, "memory-0").ok());
  ASSERT_TRUE(placed_->Assign(2, "compute-0").ok());
  const std::vector<std::vector<int32_t>> prompts = GoldenPrompts();
  std::vector<PrefillSequence> batch;
  for (int p = 0; p < 3; ++p) batch.push_back({p, prompts[p]});
  Tensor want, got;
  ASSERT_TRUE(reference.Prefill(batch, false, &want).ok());
  ASSERT_TRUE(placed.Prefill(batch, false, &got).ok());
  ASSERT_EQ(want.shape(), got.shape());
  for (int64_t i = 0; i < want.size(); ++i) ASSERT_EQ(want.data()[i], got.data()[i]) << "prefill logit " << i;
  // Where each prompt's slots went.
  EXPECT_EQ(pool_->With([](AttentionExecutor& e) { return e.num_sequences(); }), 2);
  EXPECT_EQ(memory_node_->num_sequences(), 1);

  for (int step = 0; step < 4; ++step) {
    std::vector<DecodeToken> tokens;
    for (int p = 0; p < 3; ++p) {
      tokens.push_back({p, ArgMax(want.row(p), weights_->config.vocab_size),
                        static_cast<int32_t>(prompts[p].size() + step)});
    }
    ASSERT_TRUE(reference.Decode(tokens, &want).ok());
    ASSERT_TRUE(placed.Decode(tokens, &got).ok());
    for (int64_t i = 0; i < want.size(); ++i) ASSERT_EQ(want.data()[i], got.data()[i]) << "step " << step;
  }

  // Freed where they live.
  placed_->Free(1);
  EXPECT_EQ(memory_node_->num_sequences(), 0);
  EXPECT_EQ(pool_->With([](AttentionExecutor& e) { return e.num_sequences(); }), 2);
  placed_->Free(0);
  placed_->Free(2);
  EXPECT_EQ(pool_->With([](AttentionExecutor& e) { return e.num_free_slots(); }), options_.num_slots);
}

TEST_F(PlacedAttentionTest, ALostMemoryNodeFailsOnlyTheStepsThatReachIt) {
  ComputeEngine placed(weights_.get(), placed_.get());
  ASSERT_TRUE(placed_->Assign(0, "compute-0").ok());
  ASSERT_TRUE(placed_->Assign(1, "memory-0").ok());
  const std::vector<int32_t> prompt = {509, 40, 41};
  PrefillSequence batch[] = {{0, prompt}, {1, prompt}};
  Tensor logits;
  ASSERT_TRUE(placed.Prefill(batch, false, &logits).ok());
  server_.reset();  // the memory node goes away

  DecodeToken both[] = {{0, 42, 3}, {1, 42, 3}};
  const absl::Status failed = placed.Decode(both, &logits);
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  const std::vector<RemoteAttention::FailedNode> nodes = placed_->TakeFailedNodes();
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].name, "memory-0");

  // The coordinator drops the lost node's sequence; the local one goes on.
  DecodeToken local_only[] = {{0, 42, 3}};
  const absl::Status ok = placed.Decode(local_only, &logits);
  EXPECT_TRUE(ok.ok()) << ok;
  EXPECT_TRUE(placed_->TakeFailedNodes().empty());
}

TEST_F(PlacedAttentionTest, SequencesGoOnlyWhereThisNodeCanReach) {
  const absl::Status unknown = placed_->Assign(5, "memory-9");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("memory-9"), std::string::npos) << unknown;

  // With no pool of its own, a plan placing a sequence on the compute node is refused by name.
  auto remote_only = PlacedAttention::Create(nullptr, "compute-0", remote_.get());
  ASSERT_TRUE(remote_only.ok());
  const absl::Status refused = (*remote_only)->Assign(5, "compute-0");
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("compute-0"), std::string::npos) << refused;

  // Neither a pool nor memory nodes: nothing could hold a sequence.
  EXPECT_EQ(PlacedAttention::Create(nullptr, "compute-0", nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PlacedAttentionTest, OnTheCpuThereIsNoDeviceStepAndAStepLeavesThePoolAsItFoundIt) {
  EXPECT_EQ(placed_->local_device_decode(), nullptr);  // a CPU pool runs the host path
  // A failed reservation (more than the pool holds) takes nothing.
  const Reservation too_many[] = {{7, static_cast<int32_t>(options_.num_slots) + 1}};
  EXPECT_EQ(placed_->Reserve(too_many).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool_->With([](AttentionExecutor& e) { return e.num_free_slots(); }), options_.num_slots);
}

}  // namespace
}  // namespace lamina
