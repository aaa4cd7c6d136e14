// TCP transport: each message is a 32-byte frame header (magic, type, flags, tag, payload length)
// followed by the payload, written with one sendmsg. TCP_NODELAY keeps small per-layer messages
// from waiting on Nagle.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/transport/transport.h"

namespace lamina {
namespace {

constexpr uint32_t kMagic = 0x4c4d4e31;  // "LMN1"
constexpr uint64_t kMaxPayload = 1ull << 32;
// A payload's buffer grows at most this far past the bytes that have arrived, so a frame that
// claims gigabytes and sends little (a broken or hostile peer) costs little memory.
constexpr uint64_t kReceiveStep = 16ull << 20;

struct FrameHeader {
  uint32_t magic;
  uint32_t type;
  uint32_t flags;
  uint32_t reserved;
  uint64_t tag;
  uint64_t length;
};
static_assert(sizeof(FrameHeader) == 32, "frame header layout");

absl::Status Errno(const std::string& what) {
  int err = errno;
  std::string message = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ECONNREFUSED || err == ECONNRESET || err == EPIPE || err == ENOTCONN || err == EHOSTUNREACH) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address) {
  size_t colon = address.rfind(':');
  int port;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not host:port"));
  }
  return std::make_pair(address.substr(0, colon), port);
}

absl::StatusOr<sockaddr_in> Resolve(const std::string& address) {
  LAMINA_ASSIGN_OR_RETURN(auto host_port, SplitHostPort(address));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(host_port.second));
  std::string host = host_port.first == "localhost" || host_port.first.empty() ? "127.0.0.1" : host_port.first;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{}, *result = nullptr;
  hints.ai_family = AF_INET;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &result) != 0 || result == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve host '", host, "'"));
  }
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(result->ai_addr)->sin_addr;
  freeaddrinfo(result);
  return addr;
}

// Waits until `fd` is ready for `events` or the deadline passes. A deadline already past still
// looks once, so that a caller can ask what is there (or whether the peer closed) without waiting.
absl::Status WaitFor(int fd, short events, absl::Time deadline, const std::string& peer) {
  for (;;) {
    int timeout_ms = -1;
    bool last_look = false;
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - absl::Now();
      last_look = left <= absl::ZeroDuration();
      timeout_ms = last_look ? 0 : static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
    }
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, timeout_ms);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) return Errno("poll");
    if (n == 0 && last_look) {
      return absl::DeadlineExceededError(absl::StrCat("no answer from ", peer, " before the deadline"));
    }
  }
}

class TcpConnection : public Connection {
 public:
  TcpConnection(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~TcpConnection() override {
    Close();
    ::close(fd_);
  }

  absl::Status Send(const MessageHeader& header, absl::Span<const ByteSpan> parts) override {
    if (closed_) return absl::UnavailableError(absl::StrCat("connection to ", peer_, " is closed"));
    FrameHeader frame{kMagic, header.type, header.flags, 0, header.tag, 0};
    for (const ByteSpan& part : parts) frame.length += part.size();
    iov_.clear();
    iov_.push_back({&frame, sizeof(frame)});
    for (const ByteSpan& part : parts) {
      if (!part.empty()) iov_.push_back({const_cast<uint8_t*>(part.data()), part.size()});
    }
    size_t index = 0;
    while (index < iov_.size()) {
      // sendmsg rather than writev: MSG_NOSIGNAL turns a dead peer into EPIPE, not SIGPIPE.
      msghdr msg{};
      msg.msg_iov = iov_.data() + index;
      msg.msg_iovlen = std::min<size_t>(iov_.size() - index, IOV_MAX);
      ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) {
          LAMINA_RETURN_IF_ERROR(WaitFor(fd_, POLLOUT, absl::Now() + absl::Seconds(30), peer_));
          continue;
        }
        return absl::UnavailableError(absl::StrCat("send to ", peer_, " failed: ", std::strerror(errno)));
      }
      size_t written = static_cast<size_t>(n);
      while (index < iov_.size() && written >= iov_[index].iov_len) written -= iov_[index++].iov_len;
      if (index < iov_.size()) {
        iov_[index].iov_base = static_cast<uint8_t*>(iov_[index].iov_base) + written;
        iov_[index].iov_len -= written;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Receive(MessageHeader* header, std::vector<uint8_t>* payload, absl::Time deadline) override {
    FrameHeader frame;
    LAMINA_RETURN_IF_ERROR(ReadExactly(reinterpret_cast<uint8_t*>(&frame), sizeof(frame), deadline));
    if (frame.magic != kMagic || frame.length > kMaxPayload) {
      Close();
      return absl::DataLossError(absl::StrCat("malformed frame from ", peer_));
    }
    payload->clear();
    while (payload->size() < frame.length) {
      const size_t have = payload->size();
      payload->resize(std::min<uint64_t>(frame.length, have + kReceiveStep));
      LAMINA_RETURN_IF_ERROR(ReadExactly(payload->data() + have, payload->size() - have, deadline));
    }
    *header = MessageHeader{frame.type, frame.flags, frame.tag};
    return absl::OkStatus();
  }

  void Close() override {
    if (!closed_.exchange(true)) ::shutdown(fd_, SHUT_RDWR);
  }

  // The peer's FIN (POLLRDHUP) or a reset (POLLHUP, POLLERR), whatever bytes are still unread.
  bool PeerClosed() override {
    if (closed_) return true;
    pollfd p{fd_, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }

  std::string peer() const override { return peer_; }

 private:
  absl::Status ReadExactly(uint8_t* data, size_t size, absl::Time deadline) {
    size_t done = 0;
    while (done < size) {
      LAMINA_RETURN_IF_ERROR(WaitFor(fd_, POLLIN, deadline, peer_));
      ssize_t n = ::recv(fd_, data + done, size - done, 0);
      if (n == 0) return absl::UnavailableError(absl::StrCat("connection to ", peer_, " closed by the peer"));
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return absl::UnavailableError(absl::StrCat("receive from ", peer_, " failed: ", std::strerror(errno)));
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  int fd_;
  std::string peer_;
  std::atomic<bool> closed_{false};
  std::vector<iovec> iov_;  // reused by Send
};

class TcpListener : public Listener {
 public:
  TcpListener(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  ~TcpListener() override {
    Close();
    ::close(fd_);
  }

  absl::StatusOr<std::unique_ptr<Connection>> Accept(absl::Time deadline) override {
    for (;;) {
      if (closed_) return absl::CancelledError("listener closed");
      // Poll in short slices so that Close() is noticed promptly.
      absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(100));
      absl::Status ready = WaitFor(fd_, POLLIN, slice, address_);
      if (absl::IsDeadlineExceeded(ready)) {
        if (absl::Now() >= deadline) return absl::DeadlineExceededError("no connection before the deadline");
        continue;
      }
      LAMINA_RETURN_IF_ERROR(ready);
      sockaddr_in peer{};
      socklen_t len = sizeof(peer);
      int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
        if (closed_) return absl::CancelledError("listener closed");
        return Errno("accept");
      }
      char ip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof(ip));
      return std::unique_ptr<Connection>(new TcpConnection(fd, absl::StrCat(ip, ":", ntohs(peer.sin_port))));
    }
  }

  std::string address() const override { return address_; }
  void Close() override { closed_ = true; }

 private:
  int fd_;
  std::string address_;
  std::atomic<bool> closed_{false};
};

class TcpTransport : public Transport {
 public:
  std::string name() const override { return "tcp"; }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& address) override {
    LAMINA_ASSIGN_OR_RETURN(sockaddr_in addr, Resolve(address));
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Errno("socket");
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      absl::Status status = errno == EADDRINUSE
                                ? absl::AlreadyExistsError(absl::StrCat("address ", address, " is already in use"))
                                : Errno(absl::StrCat("bind ", address));
      ::close(fd);
      return status;
    }
    if (::listen(fd, 64) != 0) {
      absl::Status status = Errno("listen");
      ::close(fd);
      return status;
    }
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof(ip));
    return std::unique_ptr<Listener>(new TcpListener(fd, absl::StrCat(ip, ":", ntohs(addr.sin_port))));
  }

  absl::StatusOr<std::unique_ptr<Connection>> Connect(const std::string& address, absl::Time deadline) override {
    LAMINA_ASSIGN_OR_RETURN(sockaddr_in addr, Resolve(address));
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return Errno("socket");
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno != EINPROGRESS) {
      absl::Status status = absl::UnavailableError(absl::StrCat("cannot connect to ", address, ": ", std::strerror(errno)));
      ::close(fd);
      return status;
    }
    absl::Status ready = WaitFor(fd, POLLOUT, deadline, address);
    int error = 0;
    socklen_t len = sizeof(error);
    if (ready.ok()) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
    if (!ready.ok() || error != 0) {
      ::close(fd);
      if (!ready.ok()) return absl::DeadlineExceededError(absl::StrCat("connecting to ", address, " timed out"));
      return absl::UnavailableError(absl::StrCat("cannot connect to ", address, ": ", std::strerror(error)));
    }
    // Back to blocking mode: sends wait for buffer space, receives poll with deadlines.
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return std::unique_ptr<Connection>(new TcpConnection(fd, address));
  }
};

}  // namespace

std::unique_ptr<Transport> MakeTcpTransport() { return std::make_unique<TcpTransport>(); }

}  // namespace lamina
