// The compute engine over the data plane (RemoteAttention -> tcp -> AttentionServer -> executor)
// gives exactly the logits of the in-process wiring, with sequences spread over two memory nodes.
#include "compute_node/remote/remote_attention.h"

#include <initializer_list>
#include <mutex>
#include <random>

#include "compute_node/engine/compute_engine.h"
#include "gtest/gtest.h"
#include "kv/attention/attention_executor.h"
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

  // Prefills sequence 0 on m0 and 1 on m1, takes the named nodes away, and runs a decode step of
  // both: its status.
  absl::Status DecodeAfterStopping(std::initializer_list<const char*> stopped) {
    ComputeEngine remote(weights_.get(), remote_.get());
    std::vector<int32_t> prompt = {509, 40, 41};
    for (int seq : {0, 1}) {
      if (absl::Status s = remote_->Assign(seq, seq == 0 ? "m0" : "m1"); !s.ok()) return s;
    }
    PrefillSequence batch[] = {{0, prompt}, {1, prompt}};
    Tensor logits;
    if (absl::Status s = remote.Prefill(batch, false, &logits); !s.ok()) return s;
    for (const char* name : stopped) nodes_[name]->server.reset();  // the node goes away
    DecodeToken decode[] = {{0, 42, 3}, {1, 42, 3}};
    return remote.Decode(decode, &logits);
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
  const absl::Status status = DecodeAfterStopping({"m1"});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("memory node 'm1'"), std::string::npos) << status;
  const std::vector<RemoteAttention::FailedNode> failed = remote_->TakeFailedNodes();
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].name, "m1");
  EXPECT_EQ(failed[0].reason, status.message());
  EXPECT_TRUE(remote_->TakeFailedNodes().empty()) << "each failure is reported once";
}

TEST_F(RemoteAttentionTest, NodesThatFailInOneStepEachComeWithTheirOwnReason) {
  EXPECT_EQ(DecodeAfterStopping({"m0", "m1"}).code(), absl::StatusCode::kUnavailable);
  // The coordinator declares each dead with its reason: one node's must not name the other.
  const std::vector<RemoteAttention::FailedNode> failed = remote_->TakeFailedNodes();
  ASSERT_EQ(failed.size(), 2u);
  EXPECT_EQ(failed[0].name, "m0");
  EXPECT_EQ(failed[1].name, "m1");
  for (const RemoteAttention::FailedNode& node : failed) {
    const std::string other = node.name == "m0" ? "m1" : "m0";
    EXPECT_NE(node.reason.find("memory node '" + node.name + "' (127.0.0.1:"), std::string::npos) << node.reason;
    EXPECT_EQ(node.reason.find(other), std::string::npos) << node.reason;
  }
}

TEST_F(RemoteAttentionTest, ServerErrorsComeBackWithTheirCode) {
  ASSERT_TRUE(remote_->Assign(5, "m0").ok());
  Reservation too_big[] = {{5, 5000}};
  absl::Status status = remote_->Reserve(too_big);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("memory node 'm0'"), std::string::npos);
  // Reported, so that the coordinator moves only this node's sequences rather than failing the
  // step's others; its connection stays.
  const std::vector<RemoteAttention::FailedNode> failed = remote_->TakeFailedNodes();
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].name, "m0");
  EXPECT_NE(failed[0].reason.find("free slots"), std::string::npos) << failed[0].reason;
  Reservation fits[] = {{5, 4}};
  EXPECT_TRUE(remote_->Reserve(fits).ok());
}

TEST_F(RemoteAttentionTest, StoresStayInFlightUntilFlushedWhereTheirErrorsComeBack) {
  ASSERT_TRUE(remote_->Assign(7, "m0").ok());
  Reservation two[] = {{7, 2}};
  ASSERT_TRUE(remote_->Reserve(two).ok());
  const int64_t kv = shape_.kv_size;
  const std::vector<float> rows(2 * kv, 0.5f);
  // More stores than may be in flight at once, then one for a layer the model lacks: each call
  // returns once its rows are sent.
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(remote_->StoreKv(i % shape_.num_layers, 7, 0, 2, rows.data(), rows.data(), kv).ok()) << i;
  }
  ASSERT_TRUE(remote_->StoreKv(shape_.num_layers + 3, 7, 0, 2, rows.data(), rows.data(), kv).ok());
  absl::Status flushed = remote_->FlushStores();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kInvalidArgument) << flushed;
  EXPECT_NE(flushed.message().find("memory node 'm0'"), std::string::npos) << flushed;
  EXPECT_TRUE(remote_->FlushStores().ok()) << "each store's reply is read once";
  const std::vector<RemoteAttention::FailedNode> failed = remote_->TakeFailedNodes();
  ASSERT_EQ(failed.size(), 1u) << "the node that refused is reported, once";
  EXPECT_EQ(failed[0].name, "m0");
}

TEST_F(RemoteAttentionTest, ALaterRequestReadsItsOwnReplyBehindUnansweredStores) {
  ASSERT_TRUE(remote_->Assign(7, "m0").ok());
  Reservation two[] = {{7, 2}};
  ASSERT_TRUE(remote_->Reserve(two).ok());
  const int64_t kv = shape_.kv_size;
  const std::vector<float> rows(2 * kv, 0.5f);
  for (int layer = 0; layer < shape_.num_layers; ++layer) {
    ASSERT_TRUE(remote_->StoreKv(layer, 7, 0, 2, rows.data(), rows.data(), kv).ok());
  }
  // The reservation's reply comes after the stores'; it must be this call's own.
  Reservation too_big[] = {{7, 5000}};
  absl::Status status = remote_->Reserve(too_big);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  Reservation three[] = {{7, 3}};
  EXPECT_TRUE(remote_->Reserve(three).ok());
  EXPECT_TRUE(remote_->FlushStores().ok());
}

// A memory node of 4 kv heads (8 query heads of 16 dims, 2 layers) serving a client of whole
// heads, or tensor-parallel ranks of a share each (AttentionWireShape::first_kv_head).
struct HeadsNode {
  static constexpr int64_t kLayers = 2, kQ = 8 * 16, kKv = 4 * 16, kStride = kQ + 2 * kKv, kTokens = 9;
  explicit HeadsNode(Transport* transport) {
    auto made = AttentionExecutor::Create({kLayers, 64, {8, 4, 16, 0}});
    EXPECT_TRUE(made.ok());
    executor = std::move(*made);
    auto started = AttentionServer::Start(transport, "127.0.0.1:0", {kLayers, kQ, kKv, 4}, executor.get(), &mu,
                                          executor.get());
    EXPECT_TRUE(started.ok()) << started.status();
    server = std::move(*started);
  }
  std::unique_ptr<AttentionExecutor> executor;
  std::mutex mu;
  std::unique_ptr<AttentionServer> server;
};

// Rank r of `ranks`' share of rows [q | k | v] of every head: its query heads, k and v heads.
std::vector<float> ShareOf(const std::vector<float>& rows, int r, int ranks) {
  const int64_t q = HeadsNode::kQ / ranks, kv = HeadsNode::kKv / ranks;
  std::vector<float> out;
  for (size_t t = 0; t < rows.size() / HeadsNode::kStride; ++t) {
    const float* row = &rows[t * HeadsNode::kStride];
    out.insert(out.end(), row + r * q, row + (r + 1) * q);
    out.insert(out.end(), row + HeadsNode::kQ + r * kv, row + HeadsNode::kQ + (r + 1) * kv);
    out.insert(out.end(), row + HeadsNode::kQ + HeadsNode::kKv + r * kv,
               row + HeadsNode::kQ + HeadsNode::kKv + (r + 1) * kv);
  }
  return out;
}

// Through `remote` (its shape's sizes), sequence 5 on node "m": a prompt of kTokens - 1 rows of
// `rows` stored, then the last row decoded, each layer; the decode's outputs, layer after layer.
std::vector<float> StoreThenDecodeEachLayer(RemoteAttention* remote, const AttentionWireShape& shape,
                                            const std::vector<float>& rows) {
  const int64_t q = shape.q_size, kv = shape.kv_size, stride = q + 2 * kv, prompt = HeadsNode::kTokens - 1;
  EXPECT_TRUE(remote->Assign(5, "m").ok());
  Reservation r[] = {{5, static_cast<int32_t>(HeadsNode::kTokens)}};
  EXPECT_TRUE(remote->Reserve(r).ok());
  std::vector<float> outputs;
  for (int64_t layer = 0; layer < HeadsNode::kLayers; ++layer) {
    const float* layer_rows = rows.data() + layer * HeadsNode::kTokens * stride;
    EXPECT_TRUE(remote->StoreKv(layer, 5, 0, prompt, layer_rows + q, layer_rows + q + kv, stride).ok());
    EXPECT_TRUE(remote->FlushStores().ok());
    std::vector<float> out(q);
    DecodeEntry entry{5, static_cast<int32_t>(prompt)};
    absl::Status decoded = remote->Decode(layer, {&entry, 1}, layer_rows + prompt * stride, {stride, 0, q, q + kv},
                                          out.data(), q);
    EXPECT_TRUE(decoded.ok()) << decoded;
    outputs.insert(outputs.end(), out.begin(), out.end());
  }
  return outputs;
}

// Head-level partitioning over the data plane: two ranks each send one memory node only their
// heads' q/k/v and get only their heads' outputs; side by side, those are, bit for bit, what a
// client of whole heads gets from another node given the same rows. A window the node lacks is
// refused, naming it.
TEST(RemoteAttentionHeadsTest, RanksSendTheirOwnHeadsAndTogetherGetTheWholeHeadsOutputs) {
  std::unique_ptr<Transport> transport = MakeTcpTransport();
  HeadsNode whole_node(transport.get()), shared_node(transport.get());
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-2, 2);
  std::vector<float> rows(HeadsNode::kLayers * HeadsNode::kTokens * HeadsNode::kStride);
  for (float& x : rows) x = dist(rng);

  const AttentionWireShape whole_shape{HeadsNode::kLayers, HeadsNode::kQ, HeadsNode::kKv, 4};
  RemoteAttention whole(transport.get(), {{"m", whole_node.server->address()}}, whole_shape, absl::Seconds(5));
  const std::vector<float> want = StoreThenDecodeEachLayer(&whole, whole_shape, rows);

  std::vector<std::vector<float>> ranks;
  for (int r = 0; r < 2; ++r) {
    const AttentionWireShape share{HeadsNode::kLayers, HeadsNode::kQ / 2, HeadsNode::kKv / 2, 2, 2 * r};
    RemoteAttention rank(transport.get(), {{"m", shared_node.server->address()}}, share, absl::Seconds(5));
    ranks.push_back(StoreThenDecodeEachLayer(&rank, share, ShareOf(rows, r, 2)));
  }
  const int64_t half = HeadsNode::kQ / 2;
  for (int64_t layer = 0; layer < HeadsNode::kLayers; ++layer) {
    for (int r = 0; r < 2; ++r) {
      for (int64_t i = 0; i < half; ++i) {
        ASSERT_EQ(ranks[r][layer * half + i], want[layer * HeadsNode::kQ + r * half + i])
            << "layer " << layer << ", rank " << r << ", float " << i;
      }
    }
  }
  EXPECT_EQ(shared_node.executor->num_sequences(), 1) << "both ranks' rows went to one sequence";

  const AttentionWireShape outside{HeadsNode::kLayers, HeadsNode::kQ / 2, HeadsNode::kKv / 2, 2, 3};
  RemoteAttention stray(transport.get(), {{"m", shared_node.server->address()}}, outside, absl::Seconds(5));
  ASSERT_TRUE(stray.Assign(6, "m").ok());
  Reservation r[] = {{6, 2}};
  const absl::Status refused = stray.Reserve(r);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("kv heads [3, 5)"), std::string::npos) << refused;
}

}  // namespace
}  // namespace lamina
