// The TCP transport against a peer that does not speak its framing: raw bytes on a plain socket.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "common/net/sockets.h"
#include "common/security/cluster_secret.h"
#include "common/transport/transport.h"
#include "gtest/gtest.h"

namespace lamina {
namespace {

// A plain socket connected to `address` ("127.0.0.1:port"); -1 on failure.
int ConnectRaw(const std::string& address) {
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The frame header as tcp_transport.cc lays it out: magic "LMN1", type, flags, reserved, tag,
// payload length.
std::vector<uint8_t> FrameHeader(uint32_t magic, uint64_t length) {
  std::vector<uint8_t> bytes(32, 0);
  std::memcpy(bytes.data(), &magic, sizeof(magic));
  std::memcpy(bytes.data() + 24, &length, sizeof(length));
  return bytes;
}

class TcpTransportTest : public ::testing::Test {
 protected:
  // A connection accepted by the transport from a raw peer that sends `bytes` and hangs up.
  std::unique_ptr<Connection> AcceptRawPeerSending(const std::vector<uint8_t>& bytes) {
    auto listener = transport_->Listen("127.0.0.1:0");
    EXPECT_TRUE(listener.ok()) << listener.status();
    if (!listener.ok()) return nullptr;
    listener_ = std::move(*listener);
    const int fd = ConnectRaw(listener_->address());
    EXPECT_GE(fd, 0);
    auto server = listener_->Accept(absl::Now() + absl::Seconds(5));
    EXPECT_TRUE(server.ok()) << server.status();
    EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
    return server.ok() ? std::move(*server) : nullptr;
  }

  std::unique_ptr<Transport> transport_ = MakeTcpTransport();
  std::unique_ptr<Listener> listener_;
};

TEST_F(TcpTransportTest, AFrameClaimingGigabytesCostsOnlyWhatArrives) {
  std::vector<uint8_t> bytes = FrameHeader(0x4c4d4e31, uint64_t{4} << 30);
  bytes.resize(bytes.size() + 1000, 7);  // then 1000 bytes of the 4 GiB, and the peer hangs up
  std::unique_ptr<Connection> server = AcceptRawPeerSending(bytes);
  ASSERT_NE(server, nullptr);
  MessageHeader header;
  std::vector<uint8_t> payload;
  const absl::Status status = server->Receive(&header, &payload, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_LE(payload.capacity(), size_t{64} << 20);
}

TEST_F(TcpTransportTest, AFrameWithTheWrongMagicIsDataLossNamingThePeer) {
  std::unique_ptr<Connection> server = AcceptRawPeerSending(FrameHeader(0x50545448, 4));  // "HTTP"
  ASSERT_NE(server, nullptr);
  MessageHeader header;
  std::vector<uint8_t> payload;
  const absl::Status status = server->Receive(&header, &payload, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(std::string(status.message()).find("malformed frame from 127.0.0.1"), std::string::npos) << status;
}

TEST_F(TcpTransportTest, AFrameLongerThanFourGibibytesIsRefusedBeforeItsPayload) {
  std::unique_ptr<Connection> server = AcceptRawPeerSending(FrameHeader(0x4c4d4e31, (uint64_t{4} << 30) + 1));
  ASSERT_NE(server, nullptr);
  MessageHeader header;
  std::vector<uint8_t> payload;
  const absl::Status status = server->Receive(&header, &payload, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_EQ(payload.capacity(), 0u);
}

// A peer of the same host reaches the listener over its unix socket, unless told to keep to TCP;
// the cluster secret's challenge holds on both paths.
TEST(TcpSameHostTest, APeerOfThisHostConnectsOverTheUnixSocketAndProvesTheSecretThere) {
  const std::optional<ClusterSecret> secret = ClusterSecret("a secret of this test");
  std::unique_ptr<Transport> server = MakeTcpTransport(secret);
  auto listener = server->Listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok()) << listener.status();
  // Accepts one connection and receives its first message (the challenge comes first): the peer
  // it names, and the message's status and payload.
  struct Served {
    std::string peer;
    absl::Status status;
    std::vector<uint8_t> payload;
  };
  auto serve_one = [&](Served* served) {
    auto accepted = (*listener)->Accept(absl::Now() + absl::Seconds(5));
    if (!accepted.ok()) {
      served->status = accepted.status();
      return;
    }
    served->peer = (*accepted)->peer();
    MessageHeader header;
    served->status = (*accepted)->Receive(&header, &served->payload, absl::Now() + absl::Seconds(5));
  };
  const uint8_t bytes[] = {1, 2, 3};
  const ByteSpan part(bytes, sizeof(bytes));
  for (const bool unix_socket : {true, false}) {
    Served served;
    std::thread serving(serve_one, &served);
    std::unique_ptr<Transport> client = MakeTcpTransport(secret, {.same_host_unix_sockets = unix_socket});
    auto connected = client->Connect((*listener)->address(), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(connected.ok()) << connected.status();
    ASSERT_TRUE((*connected)->Send({7, 0, 9}, {&part, 1}).ok());
    serving.join();
    EXPECT_EQ(served.peer.rfind("unix socket @lamina-data-plane/127.0.0.1:", 0) == 0, unix_socket) << served.peer;
    EXPECT_TRUE(served.status.ok()) << served.status;
    EXPECT_EQ(served.payload, std::vector<uint8_t>({1, 2, 3}));
  }
  // Without the secret, the unix socket refuses the peer as TCP does: its first message is no answer.
  Served served;
  std::thread serving(serve_one, &served);
  std::unique_ptr<Transport> stranger = MakeTcpTransport();
  auto connected = stranger->Connect((*listener)->address(), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(connected.ok()) << connected.status();
  (*connected)->Send({7, 0, 9}, {&part, 1}).IgnoreError();
  serving.join();
  EXPECT_EQ(served.peer.rfind("unix socket @", 0), 0u) << served.peer;
  EXPECT_EQ(served.status.code(), absl::StatusCode::kUnauthenticated) << served.status;
}

// A process that holds a listener's unix socket name first could catch its peers: the listener
// refuses to start, as it does when its port is taken.
TEST(TcpSameHostTest, AListenerWhoseUnixSocketNameIsTakenDoesNotStart) {
  std::unique_ptr<Transport> transport = MakeTcpTransport();
  auto probe = transport->Listen("127.0.0.1:0");  // a port nobody else holds
  ASSERT_TRUE(probe.ok()) << probe.status();
  const std::string address = (*probe)->address();
  probe->reset();
  absl::StatusOr<int> squatter = ListenUnix("lamina-data-plane/" + address, 4);
  ASSERT_TRUE(squatter.ok()) << squatter.status();
  auto listener = transport->Listen(address);
  EXPECT_EQ(listener.status().code(), absl::StatusCode::kAlreadyExists) << listener.status();
  EXPECT_NE(std::string(listener.status().message()).find("lamina-data-plane/" + address), std::string::npos);
  ::close(*squatter);
  EXPECT_TRUE(transport->Listen(address).ok());
}

}  // namespace
}  // namespace lamina
