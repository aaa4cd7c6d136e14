// The TCP transport against a peer that does not speak its framing: raw bytes on a plain socket.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
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

}  // namespace
}  // namespace lamina
