// A small HTTP/1.1 server for Lamina's HTTP APIs: a thread per connection, keep-alive and
// pipelined requests, Content-Length bodies (with Expect: 100-continue), whole or chunked
// (streamed) responses, and the client's hang-up visible to a handler while it works, so that a
// request whose client went away can be cancelled.
//
// With `HttpServerOptions::tls` it speaks HTTPS only (a client's TLS handshake is part of its
// request head's time).
//
// Nothing waits forever: a connection idle between requests is closed after `idle_timeout`, a
// request must arrive whole within `read_timeout` (else 408), and a client that reads nothing for
// `write_timeout` is dropped. Malformed requests get 400, 411, 413, 431 or 505 with a message
// saying what is wrong, and only their connection is closed.
//
//   absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start("127.0.0.1:8000",
//       [](const HttpRequest& request, HttpResponder& responder) { responder.Send(200, "text/plain", "hi"); });
//
// The destructor stops accepting, hangs up every open connection (a handler then sees
// ClientGone() and failed writes) and waits for the handlers to return.
#ifndef LAMINA_COMMON_HTTP_HTTP_SERVER_H_
#define LAMINA_COMMON_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/http/http_request.h"
#include "common/net/socket_stream.h"
#include "common/security/tls_context.h"

namespace lamina {

// How a handler answers one request: either Send once, or StartStream, Write any number of times
// and EndStream. A handler that returns without answering gets a 500; one that returns in the
// middle of a stream has its connection closed (the client sees a truncated body). Used by the
// connection's own thread only.
class HttpResponder {
 public:
  // The whole response. Unavailable when the client has gone.
  absl::Status Send(int status, absl::string_view content_type, absl::string_view body);
  // The head of a response whose body follows in pieces (chunked transfer encoding).
  absl::Status StartStream(int status, absl::string_view content_type);
  // One piece, sent at once; an empty piece sends nothing.
  absl::Status Write(absl::string_view data);
  absl::Status EndStream();

  // Whether the client has hung up (closed or reset its end), without waiting or reading.
  bool ClientGone() const;
  bool started() const { return state_ != State::kNone; }

 private:
  friend class HttpServer;
  enum class State { kNone, kStreaming, kDone };
  HttpResponder(SocketStream* stream, bool keep_alive, absl::Duration write_timeout)
      : stream_(stream), keep_alive_(keep_alive), write_timeout_(write_timeout) {}
  absl::Status SendAll(absl::string_view bytes);

  SocketStream* stream_;
  bool keep_alive_;
  absl::Duration write_timeout_;
  State state_ = State::kNone;
  bool broken_ = false;  // a write failed: the connection is closed after the handler
};

using HttpHandler = std::function<void(const HttpRequest& request, HttpResponder& responder)>;

struct HttpServerOptions {
  // Past this, a new connection closes the one that has waited longest for its request head (idle,
  // or sending it slowly), so that idle sockets cannot shut other clients out; only when every
  // connection is busy with a request does a new one get 503.
  int max_connections = 1024;
  // The same, among one client address's connections: past this many, its own longest-waiting
  // connection is closed, or the new one gets 503.
  int max_connections_per_client = 256;
  // HTTPS with this server context (TlsContext::ForServer); null: plain HTTP.
  std::shared_ptr<const TlsContext> tls;
  size_t max_head_bytes = 64 << 10;
  size_t max_body_bytes = 64 << 20;
  absl::Duration idle_timeout = absl::Seconds(30);
  absl::Duration read_timeout = absl::Seconds(30);
  absl::Duration write_timeout = absl::Seconds(30);
};

class HttpServer {
 public:
  // Listens on `address` ("host:port"; port 0 picks a free one) and serves `handler` on threads
  // of its own. AlreadyExists when the address is in use.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address, HttpHandler handler,
                                                           HttpServerOptions options = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // host:port, with the real port.
  const std::string& address() const { return address_; }

 private:
  HttpServer(int listen_fd, std::string address, HttpHandler handler, HttpServerOptions options);
  void AcceptLoop();
  void Serve(int fd);
  // Reads the next request into `request`, keeping bytes past it in `buffer`. false when the
  // connection should close (after answering a bad request, or when the client left or idled).
  bool ReadRequest(SocketStream& stream, std::string* buffer, HttpRequest* request);
  void Refuse(SocketStream& stream, int status, absl::string_view message);
  // With the lock held, for a new connection from `client`: whether there is room for it, after
  // closing another that waits for its head if need be; the refusal's reason when not.
  bool MakeRoom(const std::string& client, std::string* why);

  const int listen_fd_;
  const std::string address_;
  const HttpHandler handler_;
  const HttpServerOptions options_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  // Marks `fd` waiting for a request head (since now) or busy with one.
  void SetWaiting(int fd, bool waiting);
  // With the lock held: closes the connection waiting longest for its head (of `client`'s, when
  // not empty); false when none is.
  bool EvictLongestWaiting(const std::string& client);

  std::mutex mu_;
  std::condition_variable all_closed_;
  struct Open {
    std::string client;   // the peer's address, without its port
    bool waiting = true;  // for a request head
    absl::Time since;     // when it began to
  };
  std::map<int, Open> open_ ABSL_GUARDED_BY(mu_);  // connections being served, by descriptor
};

}  // namespace lamina

#endif  // LAMINA_COMMON_HTTP_HTTP_SERVER_H_
