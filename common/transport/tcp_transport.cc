// TCP transport: each message is a 32-byte frame header (magic, type, flags, tag, payload length)
// followed by the payload, written with one sendmsg. TCP_NODELAY keeps small per-layer messages
// from waiting on Nagle.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/net/sockets.h"
#include "common/security/cluster_secret.h"
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

class TcpConnection : public Connection {
 public:
  // `challenge`: an accepted connection whose peer must prove the cluster secret before its first
  // message is read or anything is sent to it (the serving thread's first call does it).
  TcpConnection(int fd, std::string peer, const ClusterSecret* challenge = nullptr)
      : fd_(fd), peer_(std::move(peer)), challenge_(challenge) {
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~TcpConnection() override {
    Close();
    ::close(fd_);
  }

  absl::Status Send(const MessageHeader& header, absl::Span<const ByteSpan> parts) override {
    LAMINA_RETURN_IF_ERROR(ChallengeOnce());
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
          LAMINA_RETURN_IF_ERROR(WaitForSocket(fd_, POLLOUT, absl::Now() + absl::Seconds(30), peer_));
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
    LAMINA_RETURN_IF_ERROR(ChallengeOnce());
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
  absl::Status ChallengeOnce() {
    if (challenge_ == nullptr || challenged_) return challenge_error_;
    challenged_ = true;  // the challenge's own Send and Receive go through
    challenge_error_ = challenge_->Challenge(*this, absl::Now() + absl::Seconds(10));
    if (!challenge_error_.ok()) {
      std::fprintf(stderr, "data plane: %s\n", std::string(challenge_error_.message()).c_str());
      Close();
    }
    return challenge_error_;
  }

  absl::Status ReadExactly(uint8_t* data, size_t size, absl::Time deadline) {
    size_t done = 0;
    while (done < size) {
      LAMINA_RETURN_IF_ERROR(WaitForSocket(fd_, POLLIN, deadline, peer_));
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
  const ClusterSecret* challenge_;  // see the constructor
  bool challenged_ = false;
  absl::Status challenge_error_;
};

class TcpListener : public Listener {
 public:
  TcpListener(int fd, std::string address, const ClusterSecret* secret)
      : fd_(fd), address_(std::move(address)), secret_(secret) {}
  ~TcpListener() override {
    Close();
    ::close(fd_);
  }

  absl::StatusOr<std::unique_ptr<Connection>> Accept(absl::Time deadline) override {
    for (;;) {
      if (closed_) return absl::CancelledError("listener closed");
      // Poll in short slices so that Close() is noticed promptly.
      absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(100));
      absl::Status ready = WaitForSocket(fd_, POLLIN, slice, address_);
      if (absl::IsDeadlineExceeded(ready)) {
        if (absl::Now() >= deadline) return absl::DeadlineExceededError("no connection before the deadline");
        continue;
      }
      LAMINA_RETURN_IF_ERROR(ready);
      int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
        if (closed_) return absl::CancelledError("listener closed");
        return SocketError("accept");
      }
      return std::unique_ptr<Connection>(new TcpConnection(fd, PeerAddress(fd), secret_));
    }
  }

  std::string address() const override { return address_; }
  void Close() override { closed_ = true; }

 private:
  int fd_;
  std::string address_;
  const ClusterSecret* secret_;
  std::atomic<bool> closed_{false};
};

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(std::optional<ClusterSecret> secret) : secret_(std::move(secret)) {}
  std::string name() const override { return "tcp"; }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& address) override {
    // A long queue: a burst of connections waits for the accept loop instead of being retried.
    LAMINA_ASSIGN_OR_RETURN(ListeningSocket socket, ListenTcp(address, 1024));
    return std::unique_ptr<Listener>(new TcpListener(socket.fd, socket.address, secret_ ? &*secret_ : nullptr));
  }

  absl::StatusOr<std::unique_ptr<Connection>> Connect(const std::string& address, absl::Time deadline) override {
    LAMINA_ASSIGN_OR_RETURN(int fd, ConnectTcp(address, deadline));
    auto connection = std::make_unique<TcpConnection>(fd, address);
    if (secret_) LAMINA_RETURN_IF_ERROR(secret_->Answer(*connection, deadline));
    return std::unique_ptr<Connection>(std::move(connection));
  }

 private:
  const std::optional<ClusterSecret> secret_;
};

}  // namespace

std::unique_ptr<Transport> MakeTcpTransport(std::optional<ClusterSecret> secret) {
  return std::make_unique<TcpTransport>(std::move(secret));
}

}  // namespace lamina
