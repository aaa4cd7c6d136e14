// Malformed data-plane messages get an error reply; the connection and the server stay up. A
// store's transfers take consecutive steps, layer by layer.
#include "memory_node/data_plane/attention_server.h"

#include <filesystem>
#include <mutex>

#include "common/transport/wire.h"
#include "data_plane/attention_protocol.h"
#include "gtest/gtest.h"
#include "kv/attention/attention_executor.h"

namespace lamina {
namespace {

namespace ap = attention_protocol;

TEST(AttentionServerTest, MalformedRequestsAreAnsweredWithErrorsAndTheConnectionSurvives) {
  auto executor = AttentionExecutor::Create({2, 16, {2, 1, 4, 0}});
  ASSERT_TRUE(executor.ok());
  std::mutex mu;
  auto transport = MakeInprocTransport();
  auto server = AttentionServer::Start(transport.get(), "server-test", {2, 8, 4}, executor->get(), &mu);
  ASSERT_TRUE(server.ok()) << server.status();
  auto connection = transport->Connect("server-test", absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(connection.ok());

  auto call = [&](uint32_t type, const std::vector<uint8_t>& payload) {
    ByteSpan part = payload;
    EXPECT_TRUE((*connection)->Send({type, 0, 7}, {&part, 1}).ok());
    MessageHeader header;
    std::vector<uint8_t> reply;
    EXPECT_TRUE((*connection)->Receive(&header, &reply, absl::Now() + absl::Seconds(2)).ok());
    EXPECT_EQ(header.type, ap::kReply);
    EXPECT_EQ(header.tag, 7u);
    WireReader r(reply.data(), reply.size());
    int32_t code = -1;
    std::string message;
    EXPECT_TRUE(r.Get(&code).ok());
    EXPECT_TRUE(r.GetString(&message).ok());
    return std::make_pair(static_cast<absl::StatusCode>(code), message);
  };

  std::vector<uint8_t> huge_count;
  WireWriter(&huge_count).Put<uint32_t>(0xffffffffu);  // claims 4 billion reservations
  auto [code1, message1] = call(ap::kReserve, huge_count);
  EXPECT_EQ(code1, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(message1.find("claims"), std::string::npos) << message1;

  auto [code2, message2] = call(ap::kDecode, {1, 2, 3});
  EXPECT_EQ(code2, absl::StatusCode::kDataLoss) << message2;

  auto [code3, message3] = call(99, {});
  EXPECT_EQ(code3, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(message3.find("unknown data-plane message type 99"), std::string::npos);

  std::vector<uint8_t> reserve;
  WireWriter w(&reserve);
  w.Put<uint32_t>(1);
  w.Put<int64_t>(5);
  w.Put<int32_t>(3);
  auto [code4, message4] = call(ap::kReserve, reserve);
  EXPECT_EQ(code4, absl::StatusCode::kOk) << message4;
  EXPECT_EQ((*executor)->num_free_slots(), 13);

  // A prefill's k/v over a device link, asked of a pool on the CPU.
  std::vector<uint8_t> store;
  WireWriter s(&store);
  s.Put<uint64_t>(1);
  s.Put<uint32_t>(1);
  s.Put<int64_t>(5);
  s.Put<int32_t>(0);
  s.Put<int64_t>(3);
  s.Put<uint32_t>(0);
  auto [code5, message5] = call(ap::kBeginStore, store);
  EXPECT_EQ(code5, absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(message5.find("no device-side data plane"), std::string::npos) << message5;
}

// Open descriptors and threads of this process.
int64_t Entries(const char* dir) {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

TEST(AttentionServerTest, ConnectionsThatComeAndGoHoldNoDescriptorOrThread) {
  auto executor = AttentionExecutor::Create({2, 16, {2, 1, 4, 0}});
  ASSERT_TRUE(executor.ok());
  std::mutex mu;
  auto transport = MakeTcpTransport();
  auto server = AttentionServer::Start(transport.get(), "127.0.0.1:0", {2, 8, 4}, executor->get(), &mu);
  ASSERT_TRUE(server.ok()) << server.status();
  // Each connection asks for something (freeing no sequence) and waits for the answer, so that the
  // server has accepted it before the next comes.
  std::vector<uint8_t> free_none;
  WireWriter(&free_none).Put<uint32_t>(0);
  auto connect_and_close = [&] {
    auto connection = transport->Connect((*server)->address(), absl::Now() + absl::Seconds(2));
    ASSERT_TRUE(connection.ok()) << connection.status();
    ByteSpan part = free_none;
    ASSERT_TRUE((*connection)->Send({ap::kFree, 0, 1}, {&part, 1}).ok());
    MessageHeader header;
    std::vector<uint8_t> reply;
    ASSERT_TRUE((*connection)->Receive(&header, &reply, absl::Now() + absl::Seconds(2)).ok());
    (*connection)->Close();
  };
  for (int i = 0; i < 100; ++i) connect_and_close();  // settle what a first connection allocates
  absl::SleepFor(absl::Milliseconds(100));
  const int64_t fds = Entries("/proc/self/fd"), threads = Entries("/proc/self/task");
  for (int i = 0; i < 10000; ++i) connect_and_close();
  absl::SleepFor(absl::Milliseconds(100));
  // The last connection's thread and descriptor are reaped by the next accept: a few of slack.
  EXPECT_LE(Entries("/proc/self/fd"), fds + 4) << "descriptors leak per connection";
  EXPECT_LE(Entries("/proc/self/task"), threads + 4) << "threads leak per connection";
}

TEST(StoreTransferStepTest, AStoresStepsGrowLayerByLayerAndSpanLayersTimesTransfers) {
  const uint64_t first = 41;
  const int64_t layers = 3;
  const size_t transfers = 4;
  uint64_t last = first - 1;
  for (int64_t layer = 0; layer < layers; ++layer) {
    for (size_t i = 0; i < transfers; ++i) {
      const uint64_t step = ap::StoreTransferStep(first, layer, transfers, i);
      EXPECT_EQ(step, last + 1) << "layer " << layer << " transfer " << i;
      last = step;
    }
  }
  EXPECT_EQ(last, first + layers * transfers - 1);
}

// A store sends only k and v, so its transfers fit more rows in the receive buffer than q/k/v rows.
TEST(StoreTransferRowsTest, ATransferHoldsAsManyRowsOfKvAsTheBufferHasRoomFor) {
  EXPECT_EQ(ap::StoreTransferRows(256, 4096, 1024), 768);  // Llama-3-8B: 6144 floats of q/k/v, 2048 of k/v
  EXPECT_EQ(ap::StoreTransferRows(256, 512, 512), 384);    // multi-head attention: 3 / 2 as many
  for (int64_t max_rows : {1, 7, 256}) {
    for (int64_t kv : {64, 128, 1024}) {
      const int64_t q = 4 * kv;
      const int64_t rows = ap::StoreTransferRows(max_rows, q, kv);
      EXPECT_LE(rows * 2 * kv, max_rows * (q + 2 * kv));
      EXPECT_GT((rows + 1) * 2 * kv, max_rows * (q + 2 * kv));
    }
  }
}

}  // namespace
}  // namespace lamina
