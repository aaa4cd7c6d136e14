// The conformance suite every transport passes: ordering, sizes from empty to tens of MB, both
// directions at once, deadlines, a peer that goes away, and an address nobody listens on.
#include <atomic>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>

#include "absl/time/clock.h"
#include "common/transport/transport.h"
#include "gtest/gtest.h"

namespace lamina {
namespace {

// On one host the tcp transport connects over the listener's unix socket; TcpOnly over TCP alone.
struct Tcp {
  static std::unique_ptr<Transport> Make() { return MakeTcpTransport(); }
  static std::string Address() { return "127.0.0.1:0"; }
};
struct TcpOnly {
  static std::unique_ptr<Transport> Make() { return MakeTcpTransport(std::nullopt, {.same_host_unix_sockets = false}); }
  static std::string Address() { return "127.0.0.1:0"; }
};
struct Inproc {
  static std::unique_ptr<Transport> Make() { return MakeInprocTransport(); }
  static std::string Address() {
    static std::atomic<int> next{0};
    return "conformance-" + std::to_string(next++);
  }
};

template <typename T>
class TransportConformanceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transport_ = T::Make();
    auto listener = transport_->Listen(T::Address());
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = std::move(*listener);
    std::thread accept([&] {
      auto server = listener_->Accept(absl::Now() + absl::Seconds(5));
      ASSERT_TRUE(server.ok()) << server.status();
      server_ = std::move(*server);
    });
    auto client = transport_->Connect(listener_->address(), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    accept.join();
  }

  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<Connection> client_, server_;
};

using Transports = ::testing::Types<Tcp, TcpOnly, Inproc>;
TYPED_TEST_SUITE(TransportConformanceTest, Transports);

std::vector<uint8_t> Pattern(size_t size, uint8_t seed) {
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 31);
  return bytes;
}

TYPED_TEST(TransportConformanceTest, MessagesArriveWholeAndInOrderFromEmptyToLarge) {
  // Past 16 MiB the TCP transport receives a payload in steps; a small message follows a large one.
  const std::vector<size_t> sizes = {0, 1, 7, 4096, 65537, 3 << 20, (40 << 20) + 3, 5};
  std::thread sender([&] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<uint8_t> a = Pattern(sizes[i] / 2, static_cast<uint8_t>(i)), b = Pattern(sizes[i] - sizes[i] / 2, 99);
      ByteSpan parts[] = {a, b};
      ASSERT_TRUE(this->client_->Send({static_cast<uint32_t>(i), 7, 1000 + i}, parts).ok());
    }
  });
  std::vector<uint8_t> payload;
  for (size_t i = 0; i < sizes.size(); ++i) {
    MessageHeader header;
    ASSERT_TRUE(this->server_->Receive(&header, &payload, absl::Now() + absl::Seconds(10)).ok());
    EXPECT_EQ(header.type, i);
    EXPECT_EQ(header.flags, 7u);
    EXPECT_EQ(header.tag, 1000 + i);
    std::vector<uint8_t> expected = Pattern(sizes[i] / 2, static_cast<uint8_t>(i)), b = Pattern(sizes[i] - sizes[i] / 2, 99);
    expected.insert(expected.end(), b.begin(), b.end());
    EXPECT_EQ(payload, expected) << "message " << i;
  }
  sender.join();
}

TYPED_TEST(TransportConformanceTest, BothDirectionsAtOnce) {
  constexpr int kMessages = 200;
  auto pump = [](Connection* from, uint32_t type) {
    return std::thread([from, type] {
      for (int i = 0; i < kMessages; ++i) {
        std::vector<uint8_t> bytes = Pattern(1000 + i, static_cast<uint8_t>(i));
        ByteSpan part = bytes;
        ASSERT_TRUE(from->Send({type, 0, static_cast<uint64_t>(i)}, {&part, 1}).ok());
      }
    });
  };
  std::thread a = pump(this->client_.get(), 1);
  std::thread b = pump(this->server_.get(), 2);
  std::vector<uint8_t> payload;
  for (int i = 0; i < kMessages; ++i) {
    MessageHeader header;
    ASSERT_TRUE(this->server_->Receive(&header, &payload, absl::Now() + absl::Seconds(10)).ok());
    EXPECT_EQ(header.type, 1u);
    EXPECT_EQ(header.tag, static_cast<uint64_t>(i));
    EXPECT_EQ(payload, Pattern(1000 + i, static_cast<uint8_t>(i)));
    ASSERT_TRUE(this->client_->Receive(&header, &payload, absl::Now() + absl::Seconds(10)).ok());
    EXPECT_EQ(header.type, 2u);
    EXPECT_EQ(header.tag, static_cast<uint64_t>(i));
  }
  a.join();
  b.join();
}

TYPED_TEST(TransportConformanceTest, ReceiveHonoursItsDeadline) {
  MessageHeader header;
  std::vector<uint8_t> payload;
  absl::Time start = absl::Now();
  absl::Status status = this->server_->Receive(&header, &payload, start + absl::Milliseconds(100));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// A deadline already past asks what is there without waiting: nothing (DeadlineExceeded), a
// message that has arrived, or a peer that has gone.
TYPED_TEST(TransportConformanceTest, AReceivePastItsDeadlineStillLooksOnce) {
  MessageHeader header;
  std::vector<uint8_t> payload;
  EXPECT_EQ(this->server_->Receive(&header, &payload, absl::Now()).code(), absl::StatusCode::kDeadlineExceeded);
  std::vector<uint8_t> bytes = Pattern(100, 3);
  ByteSpan part = bytes;
  ASSERT_TRUE(this->client_->Send({4, 0, 44}, {&part, 1}).ok());
  absl::Status status;
  // Over a socket the bytes take a moment to arrive: look again until they have.
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  do {
    status = this->server_->Receive(&header, &payload, absl::InfinitePast());
  } while (absl::IsDeadlineExceeded(status) && absl::Now() < give_up);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(header.tag, 44u);
  EXPECT_EQ(payload, bytes);
  this->client_->Close();
  do {
    status = this->server_->Receive(&header, &payload, absl::InfinitePast());
  } while (absl::IsDeadlineExceeded(status) && absl::Now() < give_up);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
}

TYPED_TEST(TransportConformanceTest, PeerClosingIsUnavailableForReceiveAndSend) {
  this->client_->Close();
  this->client_.reset();
  MessageHeader header;
  std::vector<uint8_t> payload;
  EXPECT_EQ(this->server_->Receive(&header, &payload, absl::Now() + absl::Seconds(5)).code(),
            absl::StatusCode::kUnavailable);
  std::vector<uint8_t> bytes(1 << 20, 1);
  ByteSpan part = bytes;
  absl::Status status;
  // A socket may accept a send or two into its buffer before it notices the reset.
  for (int i = 0; i < 20 && status.ok(); ++i) status = this->server_->Send({}, {&part, 1});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
}

// A watcher learns that the peer went away without taking its messages: one sent before the close
// is still received after it.
TYPED_TEST(TransportConformanceTest, PeerClosedTellsOfAPeerGoneAndTakesNothing) {
  EXPECT_FALSE(this->server_->PeerClosed());
  EXPECT_FALSE(this->client_->PeerClosed());
  std::vector<uint8_t> bytes = Pattern(100, 5);
  ByteSpan part = bytes;
  ASSERT_TRUE(this->client_->Send({6, 0, 66}, {&part, 1}).ok());
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(this->server_->PeerClosed()) << "a message waiting is not a close";
  this->client_->Close();
  this->client_.reset();
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (!this->server_->PeerClosed() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_TRUE(this->server_->PeerClosed());
  MessageHeader header;
  std::vector<uint8_t> payload;
  ASSERT_TRUE(this->server_->Receive(&header, &payload, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(header.tag, 66u);
  EXPECT_EQ(payload, bytes);
  EXPECT_EQ(this->server_->Receive(&header, &payload, absl::Now() + absl::Seconds(5)).code(),
            absl::StatusCode::kUnavailable);
}

TYPED_TEST(TransportConformanceTest, ConnectingWhereNobodyListensIsUnavailable) {
  std::string address = this->listener_->address();
  this->listener_->Close();
  this->listener_.reset();
  auto connection = this->transport_->Connect(address, absl::Now() + absl::Seconds(2));
  EXPECT_EQ(connection.status().code(), absl::StatusCode::kUnavailable) << connection.status();
}

TYPED_TEST(TransportConformanceTest, ListeningTwiceOnOneAddressFails) {
  auto second = this->transport_->Listen(this->listener_->address());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
}

TEST(TransportTest, UnknownTransportNamesAreRefused) {
  auto t = MakeTransport("carrier-pigeon");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(t.status().message()).find("available: tcp, inproc"), std::string::npos);
}

}  // namespace
}  // namespace lamina
