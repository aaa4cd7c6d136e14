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
  if (broken_) return absl::UnavailableError(absl::StrCat("the connection to ", stream_->peer(), " is broken"));
  // A client that reads nothing for write_timeout is dropped.
  absl::Status sent = stream_->Write(bytes, absl::Now() + write_timeout_);
  if (!sent.ok()) {
    broken_ = true;
    const bool timed_out = absl::IsDeadlineExceeded(sent);
    return absl::UnavailableError(absl::StrCat("sending to ", stream_->peer(), " failed: ",
                                               timed_out ? "the client reads nothing" : sent.message()));
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
  pollfd p{stream_->fd(), POLLRDHUP, 0};
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
    const std::string peer = PeerAddress(fd);
    const std::string client = peer.substr(0, peer.rfind(':'));
    std::string why;
    bool room;
    {
      std::lock_guard<std::mutex> lock(mu_);
      room = MakeRoom(client, &why);
      if (room) open_[fd] = Open{client, true, absl::Now()};
    }
    if (!room) {
      // Over TLS a plain answer would be noise to the client: it only sees the connection close.
      if (options_.tls == nullptr) {
        std::unique_ptr<SocketStream> stream = SocketStream::Plain(fd, peer);
        Refuse(*stream, 503, why);
      }
      ::close(fd);
      continue;
    }
    std::thread([this, fd] { Serve(fd); }).detach();
  }
}

bool HttpServer::MakeRoom(const std::string& client, std::string* why) {
  int from_client = 0;
  for (const auto& [fd, state] : open_) from_client += state.client == client ? 1 : 0;
  if (from_client >= options_.max_connections_per_client && !EvictLongestWaiting(client)) {
    *why = absl::StrCat("this client has ", from_client, " connections open, all busy; try again later");
    return false;
  }
  if (from_client < options_.max_connections_per_client && static_cast<int>(open_.size()) >= options_.max_connections &&
      !EvictLongestWaiting("")) {
    *why = absl::StrCat("the server has ", options_.max_connections, " connections open; try again later");
    return false;
  }
  return true;
}

bool HttpServer::EvictLongestWaiting(const std::string& client) {
  auto oldest = open_.end();
  for (auto it = open_.begin(); it != open_.end(); ++it) {
    if (!it->second.waiting || (!client.empty() && it->second.client != client)) continue;
    if (oldest == open_.end() || it->second.since < oldest->second.since) oldest = it;
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
  it->second.waiting = waiting;
  it->second.since = absl::Now();
}

void HttpServer::Serve(int fd) {
  const std::string peer = PeerAddress(fd);
  std::unique_ptr<SocketStream> stream;
  if (options_.tls != nullptr) {
    absl::StatusOr<std::unique_ptr<SocketStream>> tls =
        SocketStream::AcceptTls(fd, peer, options_.tls, absl::Now() + options_.read_timeout);
    if (tls.ok()) stream = *std::move(tls);
  } else {
    stream = SocketStream::Plain(fd, peer);
  }
  std::string buffer;
  while (stream != nullptr) {
    HttpRequest request;
    SetWaiting(fd, true);
    if (stopping_ || !ReadRequest(*stream, &buffer, &request)) break;
    SetWaiting(fd, false);
    const bool keep_alive = request.KeepAlive();
    HttpResponder responder(stream.get(), keep_alive, options_.write_timeout);
    handler_(request, responder);
    if (!responder.started()) {
      (void)responder.Send(500, kTextType, "the server gave no answer to this request\n");
    }
    if (responder.state_ != HttpResponder::State::kDone || responder.broken_ || !keep_alive) break;
  }
  stream.reset();  // before the descriptor closes: a TLS stream's goodbye goes over it
  // Notified under the lock: once the destructor sees the set empty, this thread touches nothing
  // of the server's.
  std::lock_guard<std::mutex> lock(mu_);
  open_.erase(fd);
  ::close(fd);
  all_closed_.notify_all();
}

bool HttpServer::ReadRequest(SocketStream& stream, std::string* buffer, HttpRequest* request) {
  // Reads more bytes by `deadline`: false when the client closed, failed or missed it.
  auto read_more = [&](absl::Time deadline, bool* timed_out) {
    char bytes[16 << 10];
    absl::StatusOr<size_t> n = stream.Read(bytes, sizeof(bytes), deadline);
    *timed_out = !n.ok() && absl::IsDeadlineExceeded(n.status());
    if (!n.ok() || *n == 0) return false;
    buffer->append(bytes, *n);
    return true;
  };

  // The head: a client may idle between requests; once a request has begun it must come whole.
  absl::Time deadline = buffer->empty() ? absl::Now() + options_.idle_timeout : absl::Now() + options_.read_timeout;
  size_t head_end;
  while ((head_end = buffer->find(kHeadEnd)) == std::string::npos) {
    if (buffer->size() > options_.max_head_bytes) {
      Refuse(stream, 431, absl::StrCat("the request head is over ", options_.max_head_bytes, " bytes"));
      return false;
    }
    const bool idle = buffer->empty();
    bool timed_out;
    if (!read_more(deadline, &timed_out)) {
      if (timed_out && !idle) Refuse(stream, 408, "the request did not arrive in time");
      return false;
    }
    if (idle) deadline = absl::Now() + options_.read_timeout;
  }
  if (head_end > options_.max_head_bytes) {
    Refuse(stream, 431, absl::StrCat("the request head is over ", options_.max_head_bytes, " bytes"));
    return false;
  }
  absl::StatusOr<HttpRequest> parsed = ParseRequestHead(absl::string_view(*buffer).substr(0, head_end));
  if (!parsed.ok()) {
    Refuse(stream, HttpStatusOfReadError(parsed.status(), true), parsed.status().message());
    return false;
  }
  absl::StatusOr<size_t> length = BodyLength(*parsed, options_.max_body_bytes);
  if (!length.ok()) {
    Refuse(stream, HttpStatusOfReadError(length.status(), false), length.status().message());
    return false;
  }
  buffer->erase(0, head_end + 4);

  // The body.
  const std::string* expect = parsed->Header("expect");
  if (expect != nullptr && buffer->size() < *length) {
    if (*expect != "100-continue") {
      Refuse(stream, 417, absl::StrCat("Expect: '", *expect, "' is not understood"));
      return false;
    }
    HttpResponder interim(&stream, true, options_.write_timeout);
    if (!interim.SendAll("HTTP/1.1 100 Continue\r\n\r\n").ok()) return false;
  }
  while (buffer->size() < *length) {
    bool timed_out;
    if (!read_more(deadline, &timed_out)) {
      if (timed_out) Refuse(stream, 408, "the request body did not arrive in time");
      return false;
    }
  }
  *request = *std::move(parsed);
  request->body = buffer->substr(0, *length);
  buffer->erase(0, *length);
  return true;
}

void HttpServer::Refuse(SocketStream& stream, int status, absl::string_view message) {
  HttpResponder responder(&stream, /*keep_alive=*/false, options_.write_timeout);
  (void)responder.Send(status, kTextType, absl::StrCat(message, "\n"));
}

}  // namespace lamina
