// The compute engine over the data plane (RemoteAttention -> tcp -> AttentionServer -> executor)
// gives exactly the logits of the in-process wiring, with sequences spread over two memory nodes.
#include "compute_node/remote/remote_attention.h"

#include <mutex>

#include "compute_node/engine/compute_engine.h"
#include "gtest/gtest.h"
#include "memory_node/attention/attention_executor.h"
#include "memory_node/data_plane/attention_server.h"
#include "tests/support/golden.h"

namespace lamina {
namespace {

struct MemoryNodeFixture {
  std::unique_ptr<AttentionExecutor> executor;
  std::mutex mu;
  std::unique_ptr<AttentionServer> server;
};

class RemoteAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto weights = ModelWeights::Load(testing::ModelDir("tiny-llama3"));
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = std::move(*weights);
    const ModelConfig& c = weights_->config;
    shape_ = {c.num_layers, c.q_size(), c.kv_size()};
    transport_ = MakeTcpTransport();
    std::map<std::string, std::string> addresses;
    for (const char* name : {"m0", "m1"}) {
      auto& node = nodes_[name];
      node = std::make_unique<MemoryNodeFixture>();
      auto executor = AttentionExecutor::Create({c.num_layers, 1024, {c.num_q_heads, c.num_kv_heads, c.head_dim, 0}});
      ASSERT_TRUE(executor.ok());
      node->executor = std::move(*executor);
      auto server = AttentionServer::Start(transport_.get(), "127.0.0.1:0", shape_, node->executor.get(), &node->mu);
      ASSERT_TRUE(server.ok()) << server.status();
      node->server = std::move(*server);
      addresses[name] = node->server->address();
    }
    remote_ = std::make_unique<RemoteAttention>(transport_.get(), addresses, shape_, absl::Seconds(5));
  }

  std::unique_ptr<ModelWeights> weights_;
  AttentionWireShape shape_;
  std::unique_ptr<Transport> transport_;
  std::map<std::string, std::unique_ptr<MemoryNodeFixture>> nodes_;
  std::unique_ptr<RemoteAttention> remote_;
};

TEST_F(RemoteAttentionTest, LogitsEqualTheInProcessEngineExactly) {
  const ModelConfig& c = weights_->config;
  auto local_memory = AttentionExecutor::Create({c.num_layers, 1024, {c.num_q_heads, c.num_kv_heads, c.head_dim, 0}});
  ASSERT_TRUE(local_memory.ok());
  ComputeEngine local(weights_.get(), local_memory->get());
  ComputeEngine remote(weights_.get(), remote_.get());

  testing::GoldenTensors golden("tiny-llama3");
  std::vector<std::vector<int32_t>> prompts;
  std::vector<PrefillSequence> batch;
  for (int p = 0; p < 3; ++p) {
    prompts.push_back(golden.Ids("prompt_" + std::to_string(p) + ".ids"));
    ASSERT_TRUE(remote_->Assign(p, p % 2 == 0 ? "m0" : "m1").ok());
  }
  for (int p = 0; p < 3; ++p) batch.push_back({p, prompts[p]});
  Tensor a, b;
  ASSERT_TRUE(local.Prefill(batch, false, &a).ok());
  ASSERT_TRUE(remote.Prefill(batch, false, &b).ok());
  ASSERT_EQ(a.shape(), b.shape());
  for (int64_t i = 0; i < a.size(); ++i) ASSERT_EQ(a.data()[i], b.data()[i]);
  EXPECT_EQ(nodes_["m0"]->executor->num_sequences(), 2);
  EXPECT_EQ(nodes_["m1"]->executor->num_sequences(), 1);

  for (int step = 0; step < 5; ++step) {
    std::vector<DecodeToken> decode;
    for (int p = 0; p < 3; ++p) {
      decode.push_back({p, 40 + step, static_cast<int32_t>(prompts[p].size() + step)});
    }
    ASSERT_TRUE(local.Decode(decode, &a).ok());
    ASSERT_TRUE(remote.Decode(decode, &b).ok());
    for (int64_t i = 0; i < a.size(); ++i) ASSERT_EQ(a.data()[i], b.data()[i]) << "step " << step;
  }
  remote_->Free(0);
  EXPECT_EQ(nodes_["m0"]->executor->num_sequences(), 1);
}

TEST_F(RemoteAttentionTest, ADeadMemoryNodeIsUnavailableAndNamed) {
  ComputeEngine remote(weights_.get(), remote_.get());
  std::vector<int32_t> prompt = {509, 40, 41};
  ASSERT_TRUE(remote_->Assign(0, "m0").ok());
  ASSERT_TRUE(remote_->Assign(1, "m1").ok());
  PrefillSequence batch[] = {{0, prompt}, {1, prompt}};
  Tensor logits;
  ASSERT_TRUE(remote.Prefill(batch, false, &logits).ok());
  nodes_["m1"]->server.reset();  // the node goes away
  DecodeToken decode[] = {{0, 42, 3}, {1, 42, 3}};
  absl::Status status = remote.Decode(decode, &logits);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("memory node 'm1'"), std::string::npos) << status;
  EXPECT_EQ(remote_->TakeFailedNodes(), std::vector<std::string>{"m1"});
}

TEST_F(RemoteAttentionTest, ServerErrorsComeBackWithTheirCode) {
  ASSERT_TRUE(remote_->Assign(5, "m0").ok());
  Reservation too_big[] = {{5, 5000}};
  absl::Status status = remote_->Reserve(too_big);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("memory node 'm0'"), std::string::npos);
  EXPECT_TRUE(remote_->TakeFailedNodes().empty()) << "an error reply is not a dead node";
}

}  // namespace
}  // namespace lamina
