#include "common/net/sockets.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status/status_macros.h"

namespace lamina {
namespace {

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address) {
  size_t colon = address.rfind(':');
  int port;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not host:port"));
  }
  return std::make_pair(address.substr(0, colon), port);
}

std::string Ipv4Text(const sockaddr_in& addr) {
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof(ip));
  return absl::StrCat(ip, ":", ntohs(addr.sin_port));
}

}  // namespace

std::string ListenAddress(const std::string& address) {
  const char* host = std::getenv("LAMINA_LISTEN_HOST");
  if (host == nullptr || *host == '\0') return address;
  return absl::StrCat(host, address.substr(address.rfind(':')));
}

absl::Status SocketError(const std::string& what) {
  int err = errno;
  std::string message = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ECONNREFUSED || err == ECONNRESET || err == EPIPE || err == ENOTCONN || err == EHOSTUNREACH) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

absl::StatusOr<sockaddr_in> ResolveIpv4(const std::string& address) {
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

absl::Status WaitForSocket(int fd, short events, absl::Time deadline, const std::string& peer) {
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
    if (n < 0 && errno != EINTR) return SocketError("poll");
    if (n == 0 && last_look) {
      return absl::DeadlineExceededError(absl::StrCat("no answer from ", peer, " before the deadline"));
    }
  }
}

absl::StatusOr<ListeningSocket> ListenTcp(const std::string& address, int backlog) {
  LAMINA_ASSIGN_OR_RETURN(sockaddr_in addr, ResolveIpv4(address));
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return SocketError("socket");
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    absl::Status status = errno == EADDRINUSE
                              ? absl::AlreadyExistsError(absl::StrCat("address ", address, " is already in use"))
                              : SocketError(absl::StrCat("bind ", address));
    ::close(fd);
    return status;
  }
  if (::listen(fd, backlog) != 0) {
    absl::Status status = SocketError("listen");
    ::close(fd);
    return status;
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ListeningSocket{fd, Ipv4Text(addr)};
}

absl::StatusOr<int> ConnectTcp(const std::string& address, absl::Time deadline) {
  LAMINA_ASSIGN_OR_RETURN(sockaddr_in addr, ResolveIpv4(address));
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return SocketError("socket");
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno != EINPROGRESS) {
    absl::Status status =
        absl::UnavailableError(absl::StrCat("cannot connect to ", address, ": ", std::strerror(errno)));
    ::close(fd);
    return status;
  }
  absl::Status ready = WaitForSocket(fd, POLLOUT, deadline, address);
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
  return fd;
}

absl::StatusOr<std::string> ResolvedAddress(const std::string& address) {
  LAMINA_ASSIGN_OR_RETURN(sockaddr_in addr, ResolveIpv4(address));
  return Ipv4Text(addr);
}

namespace {

// The abstract-namespace address of `name`: a leading NUL, then the name (not NUL-terminated).
absl::StatusOr<std::pair<sockaddr_un, socklen_t>> AbstractAddress(const std::string& name) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a unix socket name of 1 to ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  return std::make_pair(addr, static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size()));
}

}  // namespace

absl::StatusOr<int> ListenUnix(const std::string& name, int backlog) {
  LAMINA_ASSIGN_OR_RETURN(auto address, AbstractAddress(name));
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return SocketError("socket");
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address.first), address.second) != 0 || ::listen(fd, backlog) != 0) {
    absl::Status status = errno == EADDRINUSE
                              ? absl::AlreadyExistsError(absl::StrCat("unix socket @", name, " is already in use"))
                              : SocketError(absl::StrCat("listen on unix socket @", name));
    ::close(fd);
    return status;
  }
  return fd;
}

absl::StatusOr<int> ConnectUnix(const std::string& name, absl::Time deadline) {
  LAMINA_ASSIGN_OR_RETURN(auto address, AbstractAddress(name));
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return SocketError("socket");
  for (;;) {
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address.first), address.second) == 0) break;
    const int error = errno;
    if (error == EINTR) continue;
    if (error == EAGAIN && absl::Now() < deadline) {  // the listener's queue is full: it drains as it accepts
      absl::SleepFor(absl::Milliseconds(1));
      continue;
    }
    ::close(fd);
    if (error == ECONNREFUSED || error == ENOENT) {
      return absl::NotFoundError(absl::StrCat("nobody listens on unix socket @", name));
    }
    return absl::UnavailableError(absl::StrCat("cannot connect to unix socket @", name, ": ", std::strerror(error)));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string PeerAddress(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || addr.sin_family != AF_INET) return "?";
  return Ipv4Text(addr);
}

}  // namespace lamina
