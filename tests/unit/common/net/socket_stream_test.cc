#include "common/net/socket_stream.h"

#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <string>
#include <thread>

#include "common/security/self_signed.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace lamina {
namespace {

// A connected pair of sockets, closed at the end.
struct SocketPair {
  SocketPair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0); }
  ~SocketPair() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  int fds[2];
};

// A certificate for 127.0.0.1 and localhost, and a client context trusting it.
class TlsStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cert_ = dir_.path() + "/c.pem";
    key_ = dir_.path() + "/c.key";
    ASSERT_TRUE(WriteSelfSignedCertificate({"127.0.0.1", "localhost"}, 1, cert_, key_).ok());
    server_ = *TlsContext::ForServer(cert_, key_);
    client_ = *TlsContext::ForClient(cert_);
  }

  // Both halves of a handshake over `pair`, the client dialling `host`.
  std::pair<absl::StatusOr<std::unique_ptr<SocketStream>>, absl::StatusOr<std::unique_ptr<SocketStream>>> Handshake(
      SocketPair& pair, const std::string& host, std::shared_ptr<const TlsContext> client) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    auto server = std::async(std::launch::async, [&] {
      return SocketStream::AcceptTls(pair.fds[0], "client", server_, deadline);
    });
    auto connected = SocketStream::ConnectTls(pair.fds[1], "server", host, client, deadline);
    return {server.get(), std::move(connected)};
  }

  testing::TempDir dir_;
  std::string cert_, key_;
  std::shared_ptr<const TlsContext> server_, client_;
};

std::string ReadExactly(SocketStream& stream, size_t size) {
  std::string out;
  char buffer[64 << 10];
  while (out.size() < size) {
    absl::StatusOr<size_t> n = stream.Read(buffer, sizeof(buffer), absl::Now() + absl::Seconds(10));
    if (!n.ok() || *n == 0) break;
    out.append(buffer, *n);
  }
  return out;
}

TEST(SocketStreamTest, PlainStreamsCarryBytesAndSeeTheClose) {
  SocketPair pair;
  std::unique_ptr<SocketStream> a = SocketStream::Plain(pair.fds[0], "a"), b = SocketStream::Plain(pair.fds[1], "b");
  ASSERT_TRUE(a->Write("hello", absl::Now() + absl::Seconds(1)).ok());
  EXPECT_EQ(ReadExactly(*b, 5), "hello");
  char byte;
  absl::StatusOr<size_t> silent = b->Read(&byte, 1, absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(silent.status())) << silent.status();
  ::shutdown(pair.fds[0], SHUT_WR);
  absl::StatusOr<size_t> closed = b->Read(&byte, 1, absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(*closed, 0u);
}

TEST_F(TlsStreamTest, CarriesMegabytesBothWaysAndSeesTheClose) {
  SocketPair pair;
  auto [server, client] = Handshake(pair, "127.0.0.1", client_);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->tls());
  std::string big(8 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  // Both write at once: neither may wait on the other's reading.
  auto sent = std::async(std::launch::async,
                         [&] { return (*client)->Write(big, absl::Now() + absl::Seconds(20)); });
  EXPECT_EQ(ReadExactly(**server, big.size()), big);
  ASSERT_TRUE(sent.get().ok());
  ASSERT_TRUE((*server)->Write("reply", absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(ReadExactly(**client, 5), "reply");
  client->reset();  // sends close_notify
  char byte;
  absl::StatusOr<size_t> closed = (*server)->Read(&byte, 1, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(*closed, 0u);
}

TEST_F(TlsStreamTest, ADnsNameMatchesToo) {
  SocketPair pair;
  auto [server, client] = Handshake(pair, "localhost", client_);
  EXPECT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(client.ok()) << client.status();
}

TEST_F(TlsStreamTest, TheClientRefusesAnUntrustedOrMisnamedServer) {
  {
    SocketPair pair;
    auto [server, client] = Handshake(pair, "10.9.8.7", client_);
    EXPECT_TRUE(absl::IsUnavailable(client.status())) << client.status();
    EXPECT_NE(client.status().message().find("not trusted as 10.9.8.7"), std::string::npos) << client.status();
    EXPECT_FALSE(server.ok());
  }
  const std::string other_cert = dir_.path() + "/o.pem";
  ASSERT_TRUE(WriteSelfSignedCertificate({"127.0.0.1"}, 1, other_cert, dir_.path() + "/o.key").ok());
  SocketPair pair;
  auto [server, client] = Handshake(pair, "127.0.0.1", *TlsContext::ForClient(other_cert));
  EXPECT_TRUE(absl::IsUnavailable(client.status())) << client.status();
  EXPECT_NE(client.status().message().find("not trusted"), std::string::npos) << client.status();
}

TEST_F(TlsStreamTest, AServerGivesUpOnPlainTextAndOnSilence) {
  {
    SocketPair pair;
    ASSERT_EQ(::write(pair.fds[1], "GET / HTTP/1.1\r\n\r\n", 18), 18);
    absl::StatusOr<std::unique_ptr<SocketStream>> server =
        SocketStream::AcceptTls(pair.fds[0], "client", server_, absl::Now() + absl::Seconds(5));
    EXPECT_TRUE(absl::IsUnavailable(server.status())) << server.status();
  }
  SocketPair pair;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<SocketStream>> server =
      SocketStream::AcceptTls(pair.fds[0], "client", server_, absl::Now() + absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(server.status())) << server.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace lamina
