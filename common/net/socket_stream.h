// A connected TCP socket read and written with deadlines, in the clear or over TLS: what the HTTP
// server and client speak over. Every wait ends at its deadline (DeadlineExceeded naming the
// peer); a peer that resets or breaks the connection gives Unavailable.
//
// The descriptor stays its owner's, who closes it after the stream is gone. Neither reads nor
// writes block the descriptor itself (each call polls, then sends or receives without waiting),
// so its blocking mode does not matter, and no write raises SIGPIPE.
// Thread-compatible: one thread reads and writes; another may shutdown(2) the descriptor to end
// a wait early.
#ifndef LAMINA_COMMON_NET_SOCKET_STREAM_H_
#define LAMINA_COMMON_NET_SOCKET_STREAM_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/security/tls_context.h"

typedef struct ssl_st SSL;

namespace lamina {

class SocketStream {
 public:
  static std::unique_ptr<SocketStream> Plain(int fd, std::string peer);
  // The server's half of a TLS handshake, by `deadline`. Unavailable, naming the peer and
  // OpenSSL's reason, when the client speaks something else or gives up.
  static absl::StatusOr<std::unique_ptr<SocketStream>> AcceptTls(int fd, std::string peer,
                                                                 std::shared_ptr<const TlsContext> context,
                                                                 absl::Time deadline);
  // The client's half: verifies the server's certificate against the context's roots and its
  // name against `host` (a DNS name or an IPv4 address). Unavailable, naming what failed (an
  // untrusted certificate, another host's), when the server cannot be trusted.
  static absl::StatusOr<std::unique_ptr<SocketStream>> ConnectTls(int fd, std::string peer, const std::string& host,
                                                                  std::shared_ptr<const TlsContext> context,
                                                                  absl::Time deadline);
  ~SocketStream();  // a TLS stream sends its close_notify when that needs no wait
  SocketStream(const SocketStream&) = delete;
  SocketStream& operator=(const SocketStream&) = delete;

  // Up to `size` bytes into `out` by `deadline`: how many were read, 0 once the peer has closed.
  absl::StatusOr<size_t> Read(char* out, size_t size, absl::Time deadline);
  // All of `bytes` by `deadline`.
  absl::Status Write(absl::string_view bytes, absl::Time deadline);

  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }
  bool tls() const { return ssl_ != nullptr; }

 private:
  SocketStream(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  // Starts TLS on this stream and runs the handshake (SSL_accept or SSL_connect).
  absl::Status Handshake(bool server, const std::string& host, absl::Time deadline);
  // After an SSL call returned `result`: waits for what it needs and returns true to retry it, or
  // the error. `what` says what was being done, for the message.
  absl::StatusOr<bool> AfterSslCall(int result, absl::Time deadline, const char* what);

  const int fd_;
  const std::string peer_;
  std::shared_ptr<const TlsContext> context_;
  SSL* ssl_ = nullptr;
  bool ssl_failed_ = false;  // a fatal TLS error: no close_notify may follow
};

}  // namespace lamina

#endif  // LAMINA_COMMON_NET_SOCKET_STREAM_H_
