// The memory node's data-plane server fed whatever a broken or hostile compute node might send
// (fuzz_targets.h: DataPlaneMessages).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/transport/transport.h"
#include "common/transport/wire.h"
#include "data_plane/attention_protocol.h"
#include "kv/attention/attention_executor.h"
#include "memory_node/data_plane/attention_server.h"
#include "tests/fuzz/fuzz_targets.h"

namespace lamina::fuzz {
namespace {

namespace ap = attention_protocol;

void Require(bool ok) {
  if (!ok) std::abort();
}

// The server's model: 2 layers; 2 query heads sharing 1 kv head of 4 floats.
constexpr int64_t kLayers = 2;
constexpr int64_t kQSize = 8;
constexpr int64_t kKvSize = 4;
constexpr int64_t kSlots = 16;

// One request and its reply: the reply's status code, and in `out` what follows the message.
absl::StatusCode Call(Connection* connection, uint32_t type, ByteSpan payload, uint32_t tag,
                      std::vector<uint8_t>* out) {
  Require(connection->Send({type, 0, tag}, {&payload, 1}).ok());
  MessageHeader header;
  std::vector<uint8_t> reply;
  // Nothing the server does here takes long: a missing reply is a hang.
  Require(connection->Receive(&header, &reply, absl::Now() + absl::Seconds(20)).ok());
  Require(header.type == ap::kReply && header.tag == tag);
  WireReader r(reply.data(), reply.size());
  int32_t code = -1;
  std::string message;
  Require(r.Get(&code).ok() && r.GetString(&message).ok());
  Require(code >= 0 && code <= static_cast<int32_t>(absl::StatusCode::kUnauthenticated));
  // Every refusal says why.
  Require(code == 0 || !message.empty());
  if (out != nullptr) {
    const uint8_t* rest = nullptr;
    const size_t n = r.remaining();
    Require(r.GetBytes(n, &rest).ok());
    out->assign(rest, rest + n);
  }
  return static_cast<absl::StatusCode>(code);
}

}  // namespace

void DataPlaneMessages(const uint8_t* data, size_t size) {
  auto executor = AttentionExecutor::Create({kLayers, kSlots, {2, 1, 4, 0}});
  Require(executor.ok());
  std::mutex service_mu;
  std::unique_ptr<Transport> transport = MakeInprocTransport();
  auto server = AttentionServer::Start(transport.get(), "fuzz-data-plane", {kLayers, kQSize, kKvSize},
                                       executor->get(), &service_mu);
  Require(server.ok());
  auto connection = transport->Connect("fuzz-data-plane", absl::Now() + absl::Seconds(5));
  Require(connection.ok());

  uint32_t tag = 0;
  size_t pos = 0;
  while (pos + 3 <= size) {
    const uint32_t type = data[pos] % 10;  // the eight request types, and unknown ones
    size_t length = data[pos + 1] | (size_t{data[pos + 2]} << 8);
    pos += 3;
    length = std::min(length, size - pos);
    Call(connection->get(), type, ByteSpan(data + pos, length), ++tag, nullptr);
    pos += length;
  }

  // The connection still serves, and the pool is sound: a new sequence's first token attends to
  // itself alone, so each query head's output is that token's v.
  const int64_t seq = int64_t{1} << 40;
  std::vector<uint8_t> reserve;
  WireWriter rw(&reserve);
  rw.Put<uint32_t>(1);
  rw.Put<int64_t>(seq);
  rw.Put<int32_t>(1);
  const absl::StatusCode reserved = Call(connection->get(), ap::kReserve, reserve, ++tag, nullptr);
  if (reserved != absl::StatusCode::kOk) {
    // Only when the messages took every slot.
    std::lock_guard<std::mutex> lock(service_mu);
    Require(reserved == absl::StatusCode::kResourceExhausted && (*executor)->num_free_slots() == 0);
    return;
  }
  const float qkv[kQSize + 2 * kKvSize] = {1, 2, 3, 4, 5, 6, 7, 8, 0.5f, -1, 2, 0, 9, -8, 7, 0.25f};
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    std::vector<uint8_t> decode;
    WireWriter dw(&decode);
    dw.Put<int64_t>(layer);
    dw.Put<uint32_t>(1);
    dw.Put<int64_t>(seq);
    dw.Put<int32_t>(0);
    dw.PutBytes(qkv, sizeof(qkv));
    std::vector<uint8_t> out;
    Require(Call(connection->get(), ap::kDecode, decode, ++tag, &out) == absl::StatusCode::kOk);
    Require(out.size() == kQSize * sizeof(float));
    const float* v = qkv + kQSize + kKvSize;
    for (int64_t i = 0; i < kQSize; ++i) {
      float o;
      std::memcpy(&o, out.data() + i * sizeof(float), sizeof(float));
      Require(std::fabs(o - v[i % kKvSize]) <= 1e-6f);
    }
  }
}

}  // namespace lamina::fuzz
