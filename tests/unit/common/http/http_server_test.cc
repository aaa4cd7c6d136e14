#include "common/http/http_server.h"

#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/http/http_client.h"
#include "common/net/sockets.h"
#include "common/security/self_signed.h"
#include "gtest/gtest.h"
#include "tests/support/http_client.h"
#include "tests/support/temp_dir.h"

namespace lamina {
namespace {

using testing::HttpCall;
using testing::HttpReply;
using testing::ParseHttpReplies;
using testing::ReadUntilClosed;
using testing::SendBytes;

// Answers "METHOD PATH BODY".
void Echo(const HttpRequest& request, HttpResponder& responder) {
  (void)responder.Send(200, "text/plain", absl::StrCat(request.method, " ", request.path, " ", request.body));
}

std::unique_ptr<HttpServer> StartServer(HttpHandler handler, HttpServerOptions options = {}) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start("127.0.0.1:0", std::move(handler), options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// Writes `bytes` on a new connection and reads until the server closes it.
std::string Exchange(const HttpServer& server, const std::string& bytes) {
  absl::StatusOr<int> fd = ConnectTcp(server.address(), absl::Now() + absl::Seconds(5));
  if (!fd.ok()) return "connect: " + std::string(fd.status().message());
  (void)SendBytes(*fd, bytes);
  absl::StatusOr<std::string> raw = ReadUntilClosed(*fd, absl::Seconds(10));
  ::close(*fd);
  return raw.ok() ? *raw : "read: " + std::string(raw.status().message());
}

TEST(HttpServerTest, KeepsTheConnectionForPipelinedRequestsUntilOneSaysClose) {
  std::unique_ptr<HttpServer> server = StartServer(Echo);
  ASSERT_NE(server, nullptr);
  const std::string raw = Exchange(*server,
                                   "POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyz"
                                   "GET /b HTTP/1.1\r\n\r\n"
                                   "POST /c HTTP/1.1\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi");
  absl::StatusOr<std::vector<HttpReply>> replies = ParseHttpReplies(raw);
  ASSERT_TRUE(replies.ok()) << replies.status() << "\n" << raw;
  ASSERT_EQ(replies->size(), 3u) << raw;
  EXPECT_EQ((*replies)[0].body, "POST /a xyz");
  EXPECT_EQ((*replies)[1].body, "GET /b ");
  EXPECT_EQ((*replies)[2].body, "POST /c hi");
  EXPECT_EQ((*replies)[0].headers.count("connection"), 0u);
  EXPECT_EQ((*replies)[2].headers["connection"], "close");
}

TEST(HttpServerTest, StreamsABodyInChunks) {
  std::unique_ptr<HttpServer> server = StartServer([](const HttpRequest&, HttpResponder& responder) {
    ASSERT_TRUE(responder.StartStream(200, "text/event-stream").ok());
    ASSERT_TRUE(responder.Write("data: 1\n\n").ok());
    ASSERT_TRUE(responder.Write("").ok());  // sends nothing, so it does not end the body
    ASSERT_TRUE(responder.Write("data: 2\n\n").ok());
    ASSERT_TRUE(responder.EndStream().ok());
    EXPECT_FALSE(responder.Write("late").ok());
  });
  ASSERT_NE(server, nullptr);
  absl::StatusOr<HttpReply> reply = HttpCall(server->address(), "GET", "/events");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->headers["transfer-encoding"], "chunked");
  EXPECT_EQ(reply->headers["content-type"], "text/event-stream");
  EXPECT_EQ(reply->body, "data: 1\n\ndata: 2\n\n");
  EXPECT_EQ(testing::SseData(reply->body), (std::vector<std::string>{"1", "2"}));
}

TEST(HttpServerTest, AnswersExpectContinueBeforeTheBodyIsSent) {
  std::unique_ptr<HttpServer> server = StartServer(Echo);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<int> fd = ConnectTcp(server->address(), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(SendBytes(*fd,
                        "POST /big HTTP/1.1\r\nExpect: 100-continue\r\nConnection: close\r\n"
                        "Content-Length: 5\r\n\r\n")
                  .ok());
  char interim[64] = {};
  ASSERT_TRUE(WaitForSocket(*fd, POLLIN, absl::Now() + absl::Seconds(5), "server").ok());
  const ssize_t n = ::recv(*fd, interim, sizeof(interim) - 1, 0);
  EXPECT_EQ(std::string(interim, n > 0 ? n : 0), "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(SendBytes(*fd, "12345").ok());
  absl::StatusOr<std::string> raw = ReadUntilClosed(*fd, absl::Seconds(10));
  ::close(*fd);
  ASSERT_TRUE(raw.ok());
  absl::StatusOr<std::vector<HttpReply>> replies = ParseHttpReplies(*raw);
  ASSERT_TRUE(replies.ok() && replies->size() == 1) << *raw;
  EXPECT_EQ((*replies)[0].body, "POST /big 12345");
}

TEST(HttpServerTest, BadRequestsGetAStatusAndAReasonAndTheServerGoesOn) {
  HttpServerOptions options;
  options.max_head_bytes = 1024;
  options.max_body_bytes = 100;
  std::unique_ptr<HttpServer> server = StartServer(Echo, options);
  ASSERT_NE(server, nullptr);
  struct Case {
    std::string bytes;
    int status;
    std::string body;
  };
  const std::vector<Case> cases = {
      {"GET /\r\n\r\n", 400, "the request line 'GET /' is not 'METHOD TARGET HTTP/1.1'\n"},
      {"GET / HTTP/2.0\r\n\r\n", 505, "HTTP version 'HTTP/2.0' is not served (1.0 and 1.1 are)\n"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 411,
       "a chunked request body is not taken: send Content-Length\n"},
      {"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n", 413, "the body has 101 bytes; at most 100 are taken\n"},
      {"GET / HTTP/1.1\r\nX: " + std::string(2000, 'a') + "\r\n\r\n", 431, "the request head is over 1024 bytes\n"},
      {"POST / HTTP/1.1\r\nExpect: teapot\r\nContent-Length: 4\r\n\r\n", 417, "Expect: 'teapot' is not understood\n"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<HttpReply>> replies = ParseHttpReplies(Exchange(*server, c.bytes));
    ASSERT_TRUE(replies.ok() && replies->size() == 1) << c.bytes.substr(0, 40);
    EXPECT_EQ((*replies)[0].status, c.status) << c.bytes.substr(0, 40);
    EXPECT_EQ((*replies)[0].body, c.body);
    EXPECT_EQ((*replies)[0].headers["connection"], "close");
  }
  absl::StatusOr<HttpReply> good = HttpCall(server->address(), "GET", "/still-here");
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good->body, "GET /still-here ");
}

TEST(HttpServerTest, AHandlerThatGivesNoAnswerMakesA500) {
  std::unique_ptr<HttpServer> server = StartServer([](const HttpRequest&, HttpResponder&) {});
  ASSERT_NE(server, nullptr);
  absl::StatusOr<HttpReply> reply = HttpCall(server->address(), "GET", "/");
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->status, 500);
  EXPECT_EQ(reply->body, "the server gave no answer to this request\n");
}

// A handler that waits for its client to hang up (at most 20 s) and says how long it waited.
struct WaitingHandler {
  std::atomic<bool> started{false};
  std::atomic<bool> saw_gone{false};
  void operator()(const HttpRequest&, HttpResponder& responder) {
    started = true;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      if (responder.ClientGone()) {
        saw_gone = true;
        return;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
};

bool WaitFor(const std::atomic<bool>& flag, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!flag && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  return flag;
}

// A connection whose request `waiting` has begun to handle on `server`; -1 when that failed.
int BusyConnection(const HttpServer& server, const WaitingHandler& waiting) {
  absl::StatusOr<int> fd = ConnectTcp(server.address(), absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(fd.ok()) << fd.status();
  if (!fd.ok()) return -1;
  EXPECT_TRUE(SendBytes(*fd, "GET /slow HTTP/1.1\r\n\r\n").ok());
  if (!WaitFor(waiting.started, absl::Seconds(5))) {
    ::close(*fd);
    return -1;
  }
  return *fd;
}

TEST(HttpServerTest, AHandlerSeesItsClientHangUp) {
  WaitingHandler waiting;
  std::unique_ptr<HttpServer> server =
      StartServer([&waiting](const HttpRequest& r, HttpResponder& responder) { waiting(r, responder); });
  ASSERT_NE(server, nullptr);
  const int fd = BusyConnection(*server, waiting);
  ASSERT_GE(fd, 0);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(waiting.saw_gone);
  ::close(fd);
  EXPECT_TRUE(WaitFor(waiting.saw_gone, absl::Seconds(2)));
}

TEST(HttpServerTest, StoppingTheServerHangsUpOnBusyHandlers) {
  WaitingHandler waiting;
  std::unique_ptr<HttpServer> server =
      StartServer([&waiting](const HttpRequest& r, HttpResponder& responder) { waiting(r, responder); });
  ASSERT_NE(server, nullptr);
  const int fd = BusyConnection(*server, waiting);
  ASSERT_GE(fd, 0);
  const absl::Time start = absl::Now();
  server.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(waiting.saw_gone);
  absl::StatusOr<std::string> rest = ReadUntilClosed(fd, absl::Seconds(5));
  EXPECT_TRUE(rest.ok()) << rest.status();  // closed, not left hanging
  ::close(fd);
}

TEST(HttpServerTest, IdleAndSlowClientsAreClosedOnTime) {
  HttpServerOptions options;
  options.idle_timeout = absl::Milliseconds(200);
  options.read_timeout = absl::Milliseconds(300);
  std::unique_ptr<HttpServer> server = StartServer(Echo, options);
  ASSERT_NE(server, nullptr);
  absl::Time start = absl::Now();
  EXPECT_EQ(Exchange(*server, ""), "");  // an idle connection is closed without a word
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  start = absl::Now();
  absl::StatusOr<std::vector<HttpReply>> replies = ParseHttpReplies(Exchange(*server, "GET / HTTP/1.1\r\nHost"));
  ASSERT_TRUE(replies.ok() && replies->size() == 1);
  EXPECT_EQ((*replies)[0].status, 408);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(HttpServerTest, AnIdleConnectionGivesWayToANewOneAtTheLimit) {
  HttpServerOptions options;
  options.max_connections = 1;
  std::unique_ptr<HttpServer> server = StartServer(Echo, options);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<int> idle = ConnectTcp(server->address(), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(idle.ok());
  absl::SleepFor(absl::Milliseconds(300));  // taken by the server
  absl::StatusOr<std::vector<HttpReply>> replies =
      ParseHttpReplies(Exchange(*server, "GET /x HTTP/1.1\r\nConnection: close\r\n\r\n"));
  ASSERT_TRUE(replies.ok() && replies->size() == 1);
  EXPECT_EQ((*replies)[0].status, 200);
  absl::StatusOr<std::string> closed = ReadUntilClosed(*idle, absl::Seconds(5));
  EXPECT_TRUE(closed.ok() && closed->empty()) << "the idle connection is closed, unanswered";
  ::close(*idle);
}

TEST(HttpServerTest, ConnectionsPastTheLimitGet503WhenEveryOneIsBusy) {
  HttpServerOptions options;
  options.max_connections = 1;
  std::atomic<bool> release{false};
  std::unique_ptr<HttpServer> server = StartServer(
      [&](const HttpRequest& request, HttpResponder& responder) {
        while (!release) absl::SleepFor(absl::Milliseconds(5));
        Echo(request, responder);
      },
      options);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<int> busy = ConnectTcp(server->address(), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(busy.ok());
  ASSERT_TRUE(SendBytes(*busy, "GET /slow HTTP/1.1\r\n\r\n").ok());
  absl::SleepFor(absl::Milliseconds(300));  // its request is being handled
  absl::StatusOr<std::vector<HttpReply>> replies = ParseHttpReplies(Exchange(*server, "GET / HTTP/1.1\r\n\r\n"));
  ASSERT_TRUE(replies.ok() && replies->size() == 1);
  EXPECT_EQ((*replies)[0].status, 503);
  EXPECT_EQ((*replies)[0].body, "the server has 1 connections open; try again later\n");
  release = true;
  ::close(*busy);
}

TEST(HttpServerTest, AClientIsServedWhileTwoThousandIdleConnectionsAreHeld) {
  rlimit files;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  if (files.rlim_max < 4096) GTEST_SKIP() << "this machine allows " << files.rlim_max << " open files";
  files.rlim_cur = std::max<rlim_t>(files.rlim_cur, 4096);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &files), 0);
  std::unique_ptr<HttpServer> server = StartServer(Echo);  // 1024 connections at most
  ASSERT_NE(server, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 2000; ++i) {
    absl::StatusOr<int> fd = ConnectTcp(server->address(), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(fd.ok()) << i << ": " << fd.status();
    idle.push_back(*fd);
    if (i % 100 == 99) {  // some send half a head
      ASSERT_TRUE(SendBytes(*fd, "GET /x HTTP/1.1\r\n").ok());
    }
  }
  absl::SleepFor(absl::Milliseconds(500));
  absl::StatusOr<HttpReply> reply = HttpCall(server->address(), "POST", "/served", "yes", absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->body, "POST /served yes");
  for (int fd : idle) ::close(fd);
}

// A connection to `address` from the loopback address `source` (127.0.0.2, ...): another client.
int ConnectFrom(const std::string& source, const std::string& address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  absl::StatusOr<sockaddr_in> from = ResolveIpv4(source + ":0"), to = ResolveIpv4(address);
  EXPECT_TRUE(from.ok() && to.ok());
  EXPECT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&*from), sizeof(*from)), 0);
  EXPECT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&*to), sizeof(*to)), 0);
  return fd;
}

bool HungUp(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP)) != 0;
}

TEST(HttpServerTest, OneClientsIdleConnectionsCannotCrowdOutAnother) {
  HttpServerOptions options;
  options.max_connections_per_client = 4;
  std::unique_ptr<HttpServer> server = StartServer(Echo, options);
  ASSERT_NE(server, nullptr);
  std::vector<int> hoarded;
  for (int i = 0; i < 10; ++i) {
    hoarded.push_back(ConnectFrom("127.0.0.2", server->address()));
    absl::SleepFor(absl::Milliseconds(20));  // taken in turn
  }
  absl::SleepFor(absl::Milliseconds(300));
  int closed = 0;
  for (int fd : hoarded) closed += HungUp(fd) ? 1 : 0;
  EXPECT_EQ(closed, 6) << "the client keeps its 4 newest connections";
  for (int i = 6; i < 10; ++i) EXPECT_FALSE(HungUp(hoarded[i])) << i;
  absl::StatusOr<HttpReply> reply = HttpCall(server->address(), "GET", "/other", "", absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->body, "GET /other ");
  for (int fd : hoarded) ::close(fd);
}

TEST(HttpServerTest, ServesHttpsOnlyWithTls) {
  testing::TempDir dir;
  const std::string cert = dir.path() + "/c.pem", key = dir.path() + "/c.key";
  ASSERT_TRUE(WriteSelfSignedCertificate({"127.0.0.1"}, 1, cert, key).ok());
  HttpServerOptions options;
  options.tls = *TlsContext::ForServer(cert, key);
  std::unique_ptr<HttpServer> server = StartServer(
      [](const HttpRequest& request, HttpResponder& responder) {
        if (request.path == "/stream") {
          (void)responder.StartStream(200, "text/plain");
          for (int i = 0; i < 3; ++i) (void)responder.Write(absl::StrCat("piece ", i, "\n"));
          (void)responder.EndStream();
          return;
        }
        Echo(request, responder);
      },
      options);
  ASSERT_NE(server, nullptr);
  HttpClientOptions client;
  client.tls = *TlsContext::ForClient(cert);
  const std::string body(1 << 20, 'b');
  absl::StatusOr<std::unique_ptr<HttpResponseStream>> echoed = HttpResponseStream::Open(
      server->address(), "POST", "/echo", body, "text/plain", absl::Now() + absl::Seconds(10), client);
  ASSERT_TRUE(echoed.ok()) << echoed.status();
  EXPECT_EQ((*echoed)->status(), 200);
  EXPECT_EQ(*(*echoed)->ReadAll(), "POST /echo " + body);
  absl::StatusOr<std::unique_ptr<HttpResponseStream>> streamed =
      HttpResponseStream::Open(server->address(), "GET", "/stream", "", "", absl::Now() + absl::Seconds(10), client);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(*(*streamed)->ReadAll(), "piece 0\npiece 1\npiece 2\n");

  // Plain HTTP gets no answer, and a client that does not trust the certificate stops.
  EXPECT_EQ(Exchange(*server, "GET /x HTTP/1.1\r\nConnection: close\r\n\r\n").find("HTTP/1.1"), std::string::npos);
  HttpClientOptions untrusting;
  untrusting.tls = *TlsContext::ForClient("");
  absl::StatusOr<std::unique_ptr<HttpResponseStream>> refused =
      HttpResponseStream::Open(server->address(), "GET", "/x", "", "", absl::Now() + absl::Seconds(10), untrusting);
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  // And the server goes on.
  absl::StatusOr<std::unique_ptr<HttpResponseStream>> again =
      HttpResponseStream::Open(server->address(), "GET", "/again", "", "", absl::Now() + absl::Seconds(10), client);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*(*again)->ReadAll(), "GET /again ");
}

TEST(HttpServerTest, AnAddressInUseIsRefused) {
  std::unique_ptr<HttpServer> server = StartServer(Echo);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::unique_ptr<HttpServer>> second = HttpServer::Start(server->address(), Echo);
  EXPECT_TRUE(absl::IsAlreadyExists(second.status())) << second.status();
}

}  // namespace
}  // namespace lamina
