// TCP transport: each message is a 32-byte frame header (magic, type, flags, tag, payload length)
// followed by the payload, written with one sendmsg. TCP_NODELAY keeps small per-layer messages
// from waiting on Nagle. Beside its TCP port a listener takes connections on a unix socket named
// after its address (SameHostName): a peer on the same host (network namespace) connects there
// and its messages skip the TCP/IP stack; the frames, and the cluster secret's challenge, are
// the same.
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
#include "common/transport/link_handshake.h"
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

// The unix socket beside the listener bound to `address` (ip:port, as ListenTcp reports it).
std::string SameHostName(const std::string& address) { return "lamina-data-plane/" + address; }

// A unix socket's send buffer holds a layer's rows (up to the system's wmem_max): at the default
// (about 200 KB) a message of a few hundred KB crosses in several wake-ups of both ends. TCP
// sizes its own buffers as the connection goes.
void WidenSendBuffer(int fd) {
  int bytes = 8 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
}

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
    // The buffer keeps its size between messages, so that a steady stream of like messages writes
    // no zeros into it: it grows (zero-filling only what is new) as bytes arrive.
    uint64_t done = 0;
    while (done < frame.length) {
      const uint64_t until = std::min<uint64_t>(frame.length, std::max<uint64_t>(payload->size(), done + kReceiveStep));
      if (payload->size() < until) payload->resize(until);
      LAMINA_RETURN_IF_ERROR(ReadExactly(payload->data() + done, until - done, deadline));
      done = until;
    }
    payload->resize(frame.length);
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
    challenge_error_ = ChallengePeer(*challenge_, *this, absl::Now() + absl::Seconds(10));
    if (!challenge_error_.ok()) {
      std::fprintf(stderr, "data plane: %s\n", std::string(challenge_error_.message()).c_str());
      Close();
    }
    return challenge_error_;
  }

  // Reads what has arrived before waiting (a poll) for more: a large message arrives in many
  // segments, most of them already there when the previous read returns.
  absl::Status ReadExactly(uint8_t* data, size_t size, absl::Time deadline) {
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::recv(fd_, data + done, size - done, MSG_DONTWAIT);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n == 0) return absl::UnavailableError(absl::StrCat("connection to ", peer_, " closed by the peer"));
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return absl::UnavailableError(absl::StrCat("receive from ", peer_, " failed: ", std::strerror(errno)));
      }
      LAMINA_RETURN_IF_ERROR(WaitForSocket(fd_, POLLIN, deadline, peer_));
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
  // `unix_fd`: the same-host socket beside the TCP one, or -1.
  TcpListener(int fd, int unix_fd, std::string address, const ClusterSecret* secret)
      : fd_(fd), unix_fd_(unix_fd), address_(std::move(address)), secret_(secret) {}
  ~TcpListener() override {
    Close();
    ::close(fd_);
    if (unix_fd_ >= 0) ::close(unix_fd_);
  }

  absl::StatusOr<std::unique_ptr<Connection>> Accept(absl::Time deadline) override {
    for (;;) {
      if (closed_) return absl::CancelledError("listener closed");
      // Poll in short slices so that Close() is noticed promptly.
      const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(100));
      pollfd polled[2] = {{fd_, POLLIN, 0}, {unix_fd_, POLLIN, 0}};
      const int n = ::poll(polled, unix_fd_ >= 0 ? 2 : 1,
                           static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(slice - absl::Now()) + 1)));
      if (n < 0 && errno != EINTR) return SocketError("poll");
      if (n <= 0) {
        if (absl::Now() >= deadline) return absl::DeadlineExceededError("no connection before the deadline");
        continue;
      }
      const bool same_host = unix_fd_ >= 0 && (polled[1].revents & POLLIN) != 0 && (polled[0].revents & POLLIN) == 0;
      int fd = ::accept4(same_host ? unix_fd_ : fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
        if (closed_) return absl::CancelledError("listener closed");
        return SocketError("accept");
      }
      if (same_host) WidenSendBuffer(fd);
      const std::string peer = same_host ? "unix socket @" + SameHostName(address_) : PeerAddress(fd);
      return std::unique_ptr<Connection>(new TcpConnection(fd, peer, secret_));
    }
  }

  std::string address() const override { return address_; }
  void Close() override { closed_ = true; }

 private:
  int fd_;
  int unix_fd_;
  std::string address_;
  const ClusterSecret* secret_;
  std::atomic<bool> closed_{false};
};

class TcpTransport : public Transport {
 public:
  TcpTransport(std::optional<ClusterSecret> secret, const TcpTransportOptions& options)
      : secret_(std::move(secret)), options_(options) {}
  std::string name() const override { return "tcp"; }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& address) override {
    // A long queue: a burst of connections waits for the accept loop instead of being retried.
    LAMINA_ASSIGN_OR_RETURN(ListeningSocket socket, ListenTcp(address, 1024));
    // The same-host socket's name must be this listener's: one taken already (by a process
    // waiting to catch this node's peers) fails the listen, as a taken port does.
    int unix_fd = -1;
    if (socket.address.rfind("0.0.0.0:", 0) != 0) {  // peers name a bound address, never 0.0.0.0
      absl::StatusOr<int> listening = ListenUnix(SameHostName(socket.address), 1024);
      if (!listening.ok()) {
        ::close(socket.fd);
        return listening.status();
      }
      unix_fd = *listening;
    }
    return std::unique_ptr<Listener>(
        new TcpListener(socket.fd, unix_fd, socket.address, secret_ ? &*secret_ : nullptr));
  }

  absl::StatusOr<std::unique_ptr<Connection>> Connect(const std::string& address, absl::Time deadline) override {
    // A listener on this host answers on its unix socket; elsewhere nobody does, and TCP it is.
    absl::StatusOr<int> fd = absl::NotFoundError("");
    absl::StatusOr<std::string> resolved = ResolvedAddress(address);
    if (options_.same_host_unix_sockets && resolved.ok()) {
      fd = ConnectUnix(SameHostName(*resolved), deadline);
      if (fd.ok()) WidenSendBuffer(*fd);
    }
    if (absl::IsNotFound(fd.status())) fd = ConnectTcp(address, deadline);
    if (!fd.ok()) return fd.status();
    auto connection = std::make_unique<TcpConnection>(*fd, address);
    if (secret_) LAMINA_RETURN_IF_ERROR(AnswerChallenge(*secret_, *connection, deadline));
    return std::unique_ptr<Connection>(std::move(connection));
  }

 private:
  const std::optional<ClusterSecret> secret_;
  const TcpTransportOptions options_;
};

}  // namespace

std::unique_ptr<Transport> MakeTcpTransport(std::optional<ClusterSecret> secret, const TcpTransportOptions& options) {
  return std::make_unique<TcpTransport>(std::move(secret), options);
}

}  // namespace lamina
