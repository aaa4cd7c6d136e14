#include "common/net/socket_stream.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/net/sockets.h"
#include "common/status/status_macros.h"

namespace lamina {
namespace {

bool WouldBlock() { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

// OpenSSL's I/O over the descriptor: send and recv that never wait and never raise SIGPIPE
// (OpenSSL's own socket BIO write()s, which does).
int DescriptorOf(BIO* bio) { return static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio))); }

int BioWrite(BIO* bio, const char* data, int size) {
  BIO_clear_retry_flags(bio);
  const ssize_t n = ::send(DescriptorOf(bio), data, static_cast<size_t>(size), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n < 0 && WouldBlock()) BIO_set_retry_write(bio);
  return static_cast<int>(n);
}

int BioRead(BIO* bio, char* out, int size) {
  BIO_clear_retry_flags(bio);
  const ssize_t n = ::recv(DescriptorOf(bio), out, static_cast<size_t>(size), MSG_DONTWAIT);
  if (n < 0 && WouldBlock()) BIO_set_retry_read(bio);
  return static_cast<int>(n);
}

long BioControl(BIO*, int command, long, void*) { return command == BIO_CTRL_FLUSH ? 1 : 0; }

int BioCreate(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

const BIO_METHOD* SocketBioMethod() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "lamina socket");
    BIO_meth_set_write(m, BioWrite);
    BIO_meth_set_read(m, BioRead);
    BIO_meth_set_ctrl(m, BioControl);
    BIO_meth_set_create(m, BioCreate);
    return m;
  }();
  return method;
}

}  // namespace

std::unique_ptr<SocketStream> SocketStream::Plain(int fd, std::string peer) {
  return std::unique_ptr<SocketStream>(new SocketStream(fd, std::move(peer)));
}

absl::StatusOr<std::unique_ptr<SocketStream>> SocketStream::AcceptTls(int fd, std::string peer,
                                                                      std::shared_ptr<const TlsContext> context,
                                                                      absl::Time deadline) {
  std::unique_ptr<SocketStream> stream(new SocketStream(fd, std::move(peer)));
  stream->context_ = std::move(context);
  LAMINA_RETURN_IF_ERROR(stream->Handshake(/*server=*/true, "", deadline));
  return stream;
}

absl::StatusOr<std::unique_ptr<SocketStream>> SocketStream::ConnectTls(int fd, std::string peer, const std::string& host,
                                                                       std::shared_ptr<const TlsContext> context,
                                                                       absl::Time deadline) {
  std::unique_ptr<SocketStream> stream(new SocketStream(fd, std::move(peer)));
  stream->context_ = std::move(context);
  LAMINA_RETURN_IF_ERROR(stream->Handshake(/*server=*/false, host.empty() ? "127.0.0.1" : host, deadline));
  return stream;
}

SocketStream::~SocketStream() {
  if (ssl_ == nullptr) return;
  if (!ssl_failed_) {
    ERR_clear_error();
    (void)SSL_shutdown(ssl_);  // one attempt: sends close_notify unless the socket is full
  }
  SSL_free(ssl_);  // and its BIO
}

absl::Status SocketStream::Handshake(bool server, const std::string& host, absl::Time deadline) {
  ERR_clear_error();
  ssl_ = SSL_new(context_->get());
  if (ssl_ == nullptr) return absl::InternalError(TakeOpenSslErrors("cannot start a TLS session"));
  BIO* bio = BIO_new(SocketBioMethod());
  if (bio == nullptr) return absl::InternalError(TakeOpenSslErrors("cannot start a TLS session"));
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd_)));
  SSL_set_bio(ssl_, bio, bio);
  if (server) {
    SSL_set_accept_state(ssl_);
  } else {
    in_addr ip;
    if (::inet_pton(AF_INET, host.c_str(), &ip) == 1) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), host.c_str());
    } else {
      SSL_set_tlsext_host_name(ssl_, host.c_str());
      SSL_set1_host(ssl_, host.c_str());
    }
    SSL_set_connect_state(ssl_);
  }
  for (;;) {
    const int result = SSL_do_handshake(ssl_);
    if (result == 1) return absl::OkStatus();
    if (!server && SSL_get_verify_result(ssl_) != X509_V_OK) {
      ssl_failed_ = true;
      ERR_clear_error();
      return absl::UnavailableError(absl::StrCat("the TLS certificate of ", peer_, " is not trusted as ", host, ": ",
                                                 X509_verify_cert_error_string(SSL_get_verify_result(ssl_))));
    }
    LAMINA_ASSIGN_OR_RETURN(bool retry, AfterSslCall(result, deadline, "the TLS handshake with"));
    if (!retry) {
      ssl_failed_ = true;
      return absl::UnavailableError(absl::StrCat(peer_, " closed the connection during the TLS handshake"));
    }
  }
}

absl::StatusOr<bool> SocketStream::AfterSslCall(int result, absl::Time deadline, const char* what) {
  const int saved_errno = errno;
  switch (SSL_get_error(ssl_, result)) {
    case SSL_ERROR_WANT_READ:
      LAMINA_RETURN_IF_ERROR(WaitForSocket(fd_, POLLIN, deadline, peer_));
      return true;
    case SSL_ERROR_WANT_WRITE:
      LAMINA_RETURN_IF_ERROR(WaitForSocket(fd_, POLLOUT, deadline, peer_));
      return true;
    case SSL_ERROR_ZERO_RETURN:
      return false;
    case SSL_ERROR_SYSCALL:
      ssl_failed_ = true;
      ERR_clear_error();
      if (saved_errno == 0) return false;  // the peer closed without a close_notify
      errno = saved_errno;
      return SocketError(absl::StrCat(what, " ", peer_));
    default:
      ssl_failed_ = true;
      return absl::UnavailableError(absl::StrCat(what, " ", peer_, " failed: ", TakeOpenSslErrors("a TLS error")));
  }
}

absl::StatusOr<size_t> SocketStream::Read(char* out, size_t size, absl::Time deadline) {
  if (ssl_ == nullptr) {
    for (;;) {
      const ssize_t n = ::recv(fd_, out, size, MSG_DONTWAIT);
      if (n >= 0) return static_cast<size_t>(n);
      if (!WouldBlock()) return SocketError(absl::StrCat("reading from ", peer_));
      LAMINA_RETURN_IF_ERROR(WaitForSocket(fd_, POLLIN, deadline, peer_));
    }
  }
  if (ssl_failed_) return absl::UnavailableError(absl::StrCat("the TLS connection with ", peer_, " has failed"));
  ERR_clear_error();
  for (;;) {
    errno = 0;
    const int n = SSL_read(ssl_, out, static_cast<int>(std::min<size_t>(size, INT_MAX)));
    if (n > 0) return static_cast<size_t>(n);
    LAMINA_ASSIGN_OR_RETURN(bool retry, AfterSslCall(n, deadline, "reading from"));
    if (!retry) return size_t{0};
  }
}

absl::Status SocketStream::Write(absl::string_view bytes, absl::Time deadline) {
  while (!bytes.empty()) {
    if (ssl_ == nullptr) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) {
        bytes.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      if (!WouldBlock()) return SocketError(absl::StrCat("sending to ", peer_));
      LAMINA_RETURN_IF_ERROR(WaitForSocket(fd_, POLLOUT, deadline, peer_));
      continue;
    }
    if (ssl_failed_) return absl::UnavailableError(absl::StrCat("the TLS connection with ", peer_, " has failed"));
    ERR_clear_error();
    errno = 0;
    const int n = SSL_write(ssl_, bytes.data(), static_cast<int>(std::min<size_t>(bytes.size(), INT_MAX)));
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    LAMINA_ASSIGN_OR_RETURN(bool retry, AfterSslCall(n, deadline, "sending to"));
    if (!retry) return absl::UnavailableError(absl::StrCat(peer_, " closed the TLS connection"));
  }
  return absl::OkStatus();
}

}  // namespace lamina
