// Plain IPv4 TCP sockets: the pieces the tcp transport and the HTTP server share. Every function
// returns a Status naming the address and the system's reason; descriptors are returned to the
// caller, who owns (and closes) them.
#ifndef LAMINA_COMMON_NET_SOCKETS_H_
#define LAMINA_COMMON_NET_SOCKETS_H_

#include <netinet/in.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace lamina {

// errno as a Status: Unavailable for a refused, reset or broken connection, Internal otherwise.
absl::Status SocketError(const std::string& what);

// "host:port" (a dotted address, a name, "localhost" or an empty host for 127.0.0.1) to an IPv4
// socket address. InvalidArgument names what is not host:port or cannot be resolved.
absl::StatusOr<sockaddr_in> ResolveIpv4(const std::string& address);

// Waits until `fd` is ready for `events` (poll's) or the deadline passes (DeadlineExceeded naming
// `peer`). A deadline already past still looks once, so a caller can ask without waiting.
absl::Status WaitForSocket(int fd, short events, absl::Time deadline, const std::string& peer);

struct ListeningSocket {
  int fd = -1;
  std::string address;  // host:port, with the real port when 0 was asked for
};

// A blocking listening socket (SO_REUSEADDR, close-on-exec) bound to `address`; AlreadyExists
// when the address is in use.
absl::StatusOr<ListeningSocket> ListenTcp(const std::string& address, int backlog);

// A blocking socket connected to `address` by `deadline`: Unavailable when nobody listens there,
// DeadlineExceeded when the peer does not answer in time.
absl::StatusOr<int> ConnectTcp(const std::string& address, absl::Time deadline);

// Where a daemon listens for `address` (host:port, as the topology names it for others to reach):
// the same, or with the host replaced by the LAMINA_LISTEN_HOST environment variable when set, as
// in a container that listens on every interface (0.0.0.0) behind a service name.
std::string ListenAddress(const std::string& address);

// "ip:port" of `address` (host:port) once resolved, as ListenTcp reports the address it bound.
absl::StatusOr<std::string> ResolvedAddress(const std::string& address);

// Unix-domain stream sockets in Linux's abstract namespace: no file (the name is gone with the
// last descriptor), visible to the processes of one network namespace, which on a host outside
// containers is every process of it. ListenUnix: AlreadyExists when the name is taken.
// ConnectUnix: NotFound when nobody listens under the name; Unavailable when the listener's queue
// is full past `deadline`. Both blocking and close-on-exec, as their tcp counterparts.
absl::StatusOr<int> ListenUnix(const std::string& name, int backlog);
absl::StatusOr<int> ConnectUnix(const std::string& name, absl::Time deadline);

// "ip:port" of the peer of a connected socket ("?" when unknown).
std::string PeerAddress(int fd);

}  // namespace lamina

#endif  // LAMINA_COMMON_NET_SOCKETS_H_
