#include "common/http/http_client.h"

#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/http/http_server.h"
#include "common/net/sockets.h"
#include "gtest/gtest.h"
#include "tests/support/http_client.h"

namespace lamina {
namespace {

// A server for one connection that writes `pieces` (pausing `pause` between them) after reading
// the request's head, then closes; what the request was is kept.
class RawServer {
 public:
  explicit RawServer(std::vector<std::string> pieces, absl::Duration pause = absl::ZeroDuration()) {
    absl::StatusOr<ListeningSocket> socket = ListenTcp("127.0.0.1:0", 4);
    EXPECT_TRUE(socket.ok()) << socket.status();
    listener_ = socket->fd;
    address_ = socket->address;
    thread_ = std::thread([this, pieces = std::move(pieces), pause] {
      const int fd = ::accept(listener_, nullptr, nullptr);
      if (fd < 0) return;
      char bytes[4096];
      while (request_.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(fd, bytes, sizeof(bytes), 0);
        if (n <= 0) break;
        request_.append(bytes, static_cast<size_t>(n));
      }
      for (const std::string& piece : pieces) {
        (void)testing::SendBytes(fd, piece);
        absl::SleepFor(pause);
      }
      ::close(fd);
    });
  }
  ~RawServer() {
    ::shutdown(listener_, SHUT_RDWR);
    thread_.join();
    ::close(listener_);
  }
  const std::string& address() const { return address_; }
  // Read once the stream is done with.
  const std::string& request() const { return request_; }

 private:
  int listener_ = -1;
  std::string address_;
  std::string request_;
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<HttpResponseStream>> Get(const std::string& address,
                                                        absl::Duration timeout = absl::Seconds(10)) {
  return HttpResponseStream::Open(address, "GET", "/x", "", "", absl::Now() + timeout);
}

TEST(HttpClientTest, ReadsALengthBodyAndSendsTheRequestWithItsBody) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start("127.0.0.1:0", [](const HttpRequest& request,
                                                                                           HttpResponder& responder) {
    const std::string* type = request.Header("content-type");
    (void)responder.Send(201, "text/plain",
                         absl::StrCat(request.method, " ", request.path, " ", type ? *type : "-", " ", request.body));
  });
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<HttpResponseStream>> stream = HttpResponseStream::Open(
      (*server)->address(), "POST", "/v1/x", "{\"a\": 1}", "application/json", absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->status(), 201);
  EXPECT_EQ((*stream)->headers().at("content-type"), "text/plain");
  absl::StatusOr<std::string> body = (*stream)->ReadAll();
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, "POST /v1/x application/json {\"a\": 1}");
  EXPECT_EQ(*(*stream)->Read(), "") << "the body has ended";
}

TEST(HttpClientTest, ReadsAChunkedStreamPieceByPieceAsItComes) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start("127.0.0.1:0", [](const HttpRequest&, HttpResponder& responder) {
        (void)responder.StartStream(200, "text/event-stream");
        for (int i = 0; i < 3; ++i) {
          (void)responder.Write(absl::StrCat("data: ", i, "\n\n"));
          absl::SleepFor(absl::Milliseconds(30));
        }
        (void)responder.EndStream();
      });
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<HttpResponseStream>> stream = Get((*server)->address());
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::vector<std::string> pieces;
  for (;;) {
    absl::StatusOr<std::string> piece = (*stream)->Read();
    ASSERT_TRUE(piece.ok()) << piece.status();
    if (piece->empty()) break;
    pieces.push_back(*piece);
  }
  EXPECT_EQ(pieces, (std::vector<std::string>{"data: 0\n\n", "data: 1\n\n", "data: 2\n\n"}));
}

TEST(HttpClientTest, ChunksSplitAcrossReadsAndABodyThatRunsUntilClose) {
  {
    RawServer raw(
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhe", "llo\r\n6;ext=1\r\n world\r\n", "0\r\n\r\n"},
        absl::Milliseconds(20));
    absl::StatusOr<std::unique_ptr<HttpResponseStream>> stream = Get(raw.address());
    ASSERT_TRUE(stream.ok()) << stream.status();
    absl::StatusOr<std::string> body = (*stream)->ReadAll();
    ASSERT_TRUE(body.ok()) << body.status();
    EXPECT_EQ(*body, "hello world");
    stream->reset();
    EXPECT_NE(raw.request().find("GET /x HTTP/1.1\r\n"), std::string::npos) << raw.request();
    EXPECT_NE(raw.request().find("Connection: close\r\n"), std::string::npos) << raw.request();
  }
  RawServer raw({"HTTP/1.0 200 OK\r\n\r\nuntil", " the end"});
  absl::StatusOr<std::unique_ptr<HttpResponseStream>> stream = Get(raw.address());
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(*(*stream)->ReadAll(), "until the end");
}

TEST(HttpClientTest, AnInterimResponseIsPassedOver) {
  RawServer raw({"HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"});
  absl::StatusOr<std::unique_ptr<HttpResponseStream>> stream = Get(raw.address());
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->status(), 200);
  EXPECT_EQ((*stream)->headers().count("x-interim"), 0u);
  EXPECT_EQ(*(*stream)->ReadAll(), "ok");
}

TEST(HttpClientTest, BrokenResponsesSayWhatIsWrong) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"SSH-2.0-OpenSSH\r\n\r\n"}, "did not answer in HTTP/1.x"},
      {{"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n"}, "a malformed header line"},
      {{"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n"}, "a malformed Content-Length"},
      {{"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"}, "unknown Transfer-Encoding"},
      {{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"}, "a malformed chunk size 'zz'"},
      {{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n"}, "does not end where its size says"},
      {{"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"}, "closed the connection in the middle of the body"},
      {{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"}, "in the middle of a chunk"},
      {{"HTTP/1.1 200"}, "closed the connection before answering in full"},
      {{}, "closed the connection before answering"},
  };
  for (const auto& [pieces, why] : cases) {
    RawServer raw(pieces);
    absl::StatusOr<std::unique_ptr<HttpResponseStream>> stream = Get(raw.address());
    absl::Status status = stream.ok() ? (*stream)->ReadAll().status() : stream.status();
    ASSERT_FALSE(status.ok()) << why;
    EXPECT_NE(status.message().find(why), std::string::npos) << status;
    EXPECT_NE(status.message().find(raw.address()), std::string::npos) << "names the server: " << status;
  }
}

TEST(HttpClientTest, NoServerAndASlowOneEndInTime) {
  {
    RawServer slow({"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"}, absl::Seconds(1));
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<HttpResponseStream>> stream = Get(slow.address(), absl::Milliseconds(300));
    ASSERT_TRUE(stream.ok()) << stream.status();
    absl::StatusOr<std::string> body = (*stream)->ReadAll();
    EXPECT_TRUE(absl::IsDeadlineExceeded(body.status())) << body.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(1.5));
  }
  absl::StatusOr<ListeningSocket> unused = ListenTcp("127.0.0.1:0", 1);
  ASSERT_TRUE(unused.ok());
  const std::string closed = unused->address;
  ::close(unused->fd);
  absl::StatusOr<std::unique_ptr<HttpResponseStream>> refused = Get(closed);
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
}

}  // namespace
}  // namespace lamina
