#include "common/http/http_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/net/sockets.h"
#include "common/status/status_macros.h"

namespace lamina {
namespace {

constexpr absl::string_view kTextType = "text/plain; charset=utf-8";
constexpr char kHeadEnd[] = "\r\n\r\n";

// Status of a request that cannot be read -> the HTTP status that says so.
int HttpStatusOfReadError(const absl::Status& status, bool in_head) {
  if (absl::IsUnimplemented(status)) return in_head ? 505 : 411;
  if (absl::IsOutOfRange(status)) return 413;
  return 400;
}

}  // namespace

absl::Status HttpResponder::SendAll(absl::string_view bytes) {
  if (broken_) return absl::UnavailableError(absl::StrCat("the connection to ", peer_, " is broken"));
  while (!bytes.empty()) {
    // The socket's SO_SNDTIMEO bounds each send: a client that reads nothing is dropped.
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken_ = true;
      const bool timed_out = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      return absl::UnavailableError(absl::StrCat(
          "sending to ", peer_, " failed: ", timed_out ? "the client reads nothing" : std::strerror(errno)));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status HttpResponder::Send(int status, absl::string_view content_type, absl::string_view body) {
  if (state_ != State::kNone) return absl::FailedPreconditionError("this request was already answered");
  state_ = State::kDone;
  return SendAll(absl::StrCat(ResponseHead(status, content_type, body.size(), keep_alive_), body));
}

absl::Status HttpResponder::StartStream(int status, absl::string_view content_type) {
  if (state_ != State::kNone) return absl::FailedPreconditionError("this request was already answered");
  state_ = State::kStreaming;
  return SendAll(ResponseHead(status, content_type, std::nullopt, keep_alive_));
}

absl::Status HttpResponder::Write(absl::string_view data) {
  if (state_ != State::kStreaming) return absl::FailedPreconditionError("no stream is open");
  if (data.empty()) return absl::OkStatus();
  return SendAll(Chunk(data));
}

absl::Status HttpResponder::EndStream() {
  if (state_ != State::kStreaming) return absl::FailedPreconditionError("no stream is open");
  state_ = State::kDone;
  return SendAll(kLastChunk);
}

bool HttpResponder::ClientGone() const {
  if (broken_) return true;
  pollfd p{fd_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address, HttpHandler handler,
                                                              HttpServerOptions options) {
  LAMINA_ASSIGN_OR_RETURN(ListeningSocket socket, ListenTcp(address, 512));
  return std::unique_ptr<HttpServer>(new HttpServer(socket.fd, socket.address, std::move(handler), options));
}

HttpServer::HttpServer(int listen_fd, std::string address, HttpHandler handler, HttpServerOptions options)
    : listen_fd_(listen_fd), address_(std::move(address)), handler_(std::move(handler)), options_(options) {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

HttpServer::~HttpServer() {
  stopping_ = true;
  acceptor_.join();
  ::close(listen_fd_);
  std::unique_lock<std::mutex> lock(mu_);
  for (const auto& [fd, state] : open_) ::shutdown(fd, SHUT_RDWR);
  all_closed_.wait(lock, [this] { return open_.empty(); });
}

void HttpServer::AcceptLoop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;  // short slices, so that stopping is noticed
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;  // EINTR, EAGAIN, a connection aborted before it was taken
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    const timeval send_timeout = absl::ToTimeval(options_.write_timeout);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    bool full;
    {
      std::lock_guard<std::mutex> lock(mu_);
      full = static_cast<int>(open_.size()) >= options_.max_connections && !EvictLongestWaiting();
      if (!full) open_[fd] = Open{true, absl::Now()};
    }
    if (full) {
      Refuse(fd, PeerAddress(fd), 503,
             absl::StrCat("the server has ", options_.max_connections, " connections open; try again later"));
      ::close(fd);
      continue;
    }
    std::thread([this, fd] { Serve(fd); }).detach();
  }
}

bool HttpServer::EvictLongestWaiting() {
  auto oldest = open_.end();
  for (auto it = open_.begin(); it != open_.end(); ++it) {
    if (it->second.waiting && (oldest == open_.end() || it->second.since < oldest->second.since)) oldest = it;
  }
  if (oldest == open_.end()) return false;
  // Its thread sees the connection end and closes it; it counts until then, one over the limit
  // for a moment at most per new connection.
  ::shutdown(oldest->first, SHUT_RDWR);
  oldest->second.waiting = false;  // evicted once
  return true;
}

void HttpServer::SetWaiting(int fd, bool waiting) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_.find(fd);
  if (it == open_.end()) return;
  it->second = Open{waiting, absl::Now()};
}

void HttpServer::Serve(int fd) {
  const std::string peer = PeerAddress(fd);
  std::string buffer;
  for (;;) {
    HttpRequest request;
    SetWaiting(fd, true);
    if (stopping_ || !ReadRequest(fd, peer, &buffer, &request)) break;
    SetWaiting(fd, false);
    const bool keep_alive = request.KeepAlive();
    HttpResponder responder(fd, keep_alive, peer);
    handler_(request, responder);
    if (!responder.started()) {
      (void)responder.Send(500, kTextType, "the server gave no answer to this request\n");
    }
    if (responder.state_ != HttpResponder::State::kDone || responder.broken_ || !keep_alive) break;
  }
  // Notified under the lock: once the destructor sees the set empty, this thread touches nothing
  // of the server's.
  std::lock_guard<std::mutex> lock(mu_);
  open_.erase(fd);
  ::close(fd);
  all_closed_.notify_all();
}

bool HttpServer::ReadRequest(int fd, const std::string& peer, std::string* buffer, HttpRequest* request) {
  // Reads more bytes by `deadline`: false when the client closed, failed or missed it.
  auto read_more = [&](absl::Time deadline, bool* timed_out) {
    *timed_out = false;
    absl::Status ready = WaitForSocket(fd, POLLIN, deadline, peer);
    if (!ready.ok()) {
      *timed_out = absl::IsDeadlineExceeded(ready);
      return false;
    }
    char bytes[16 << 10];
    ssize_t n;
    do {
      n = ::recv(fd, bytes, sizeof(bytes), 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return false;
    buffer->append(bytes, static_cast<size_t>(n));
    return true;
  };

  // The head: a client may idle between requests; once a request has begun it must come whole.
  absl::Time deadline = buffer->empty() ? absl::Now() + options_.idle_timeout : absl::Now() + options_.read_timeout;
  size_t head_end;
  while ((head_end = buffer->find(kHeadEnd)) == std::string::npos) {
    if (buffer->size() > options_.max_head_bytes) {
      Refuse(fd, peer, 431, absl::StrCat("the request head is over ", options_.max_head_bytes, " bytes"));
      return false;
    }
    const bool idle = buffer->empty();
    bool timed_out;
    if (!read_more(deadline, &timed_out)) {
      if (timed_out && !idle) Refuse(fd, peer, 408, "the request did not arrive in time");
      return false;
    }
    if (idle) deadline = absl::Now() + options_.read_timeout;
  }
  if (head_end > options_.max_head_bytes) {
    Refuse(fd, peer, 431, absl::StrCat("the request head is over ", options_.max_head_bytes, " bytes"));
    return false;
  }
  absl::StatusOr<HttpRequest> parsed = ParseRequestHead(absl::string_view(*buffer).substr(0, head_end));
  if (!parsed.ok()) {
    Refuse(fd, peer, HttpStatusOfReadError(parsed.status(), true), parsed.status().message());
    return false;
  }
  absl::StatusOr<size_t> length = BodyLength(*parsed, options_.max_body_bytes);
  if (!length.ok()) {
    Refuse(fd, peer, HttpStatusOfReadError(length.status(), false), length.status().message());
    return false;
  }
  buffer->erase(0, head_end + 4);

  // The body.
  const std::string* expect = parsed->Header("expect");
  if (expect != nullptr && buffer->size() < *length) {
    if (*expect != "100-continue") {
      Refuse(fd, peer, 417, absl::StrCat("Expect: '", *expect, "' is not understood"));
      return false;
    }
    HttpResponder interim(fd, true, peer);
    if (!interim.SendAll("HTTP/1.1 100 Continue\r\n\r\n").ok()) return false;
  }
  while (buffer->size() < *length) {
    bool timed_out;
    if (!read_more(deadline, &timed_out)) {
      if (timed_out) Refuse(fd, peer, 408, "the request body did not arrive in time");
      return false;
    }
  }
  *request = *std::move(parsed);
  request->body = buffer->substr(0, *length);
  buffer->erase(0, *length);
  return true;
}

void HttpServer::Refuse(int fd, const std::string& peer, int status, absl::string_view message) {
  HttpResponder responder(fd, /*keep_alive=*/false, peer);
  (void)responder.Send(status, kTextType, absl::StrCat(message, "\n"));
}

}  // namespace lamina
