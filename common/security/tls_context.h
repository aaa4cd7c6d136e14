// TLS for Lamina's client endpoints (the coordinator's HTTP and gRPC APIs): an OpenSSL context
// for a server (its certificate and key) or for a client (the certificates it trusts), TLS 1.2 or
// newer. SocketStream (common/net/socket_stream.h) speaks TLS over a socket with one.
//
//   absl::StatusOr<std::shared_ptr<const TlsContext>> server = TlsContext::ForServer("cert.pem", "key.pem");
//   absl::StatusOr<std::shared_ptr<const TlsContext>> client = TlsContext::ForClient("ca.pem");
//
// Thread-safe once made: connections on many threads share one.
#ifndef LAMINA_COMMON_SECURITY_TLS_CONTEXT_H_
#define LAMINA_COMMON_SECURITY_TLS_CONTEXT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace lamina {

// How a client reaches an endpoint: in the clear, or over TLS trusting the certificates of
// `ca_file` (PEM; the system's roots when empty).
struct ClientTls {
  bool enabled = false;
  std::string ca_file;
};

// A server's TLS files as a topology names them (`coordinator.tls`); every path empty: no TLS.
struct ServerTlsFiles {
  std::string cert_file;  // PEM certificate chain, the server's own first
  std::string key_file;   // PEM private key
  // What the cluster's own clients (nodes, `lamina up`, the CLI given the topology) trust: this
  // file, or when empty the certificate itself (a self-signed one).
  std::string ca_file;

  bool enabled() const { return !cert_file.empty(); }
  ClientTls ForClients() const { return ClientTls{enabled(), ca_file.empty() ? cert_file : ca_file}; }
};

class TlsContext {
 public:
  // For a server. InvalidArgument naming the file and OpenSSL's reason when a file cannot be read
  // or parsed, or when the key is not the certificate's.
  static absl::StatusOr<std::shared_ptr<const TlsContext>> ForServer(const std::string& cert_file,
                                                                     const std::string& key_file);
  // For a client, which verifies the server's certificate chain against `ca_file` (the system's
  // roots when empty) and its name against the host it dialled (SocketStream::ConnectTls).
  static absl::StatusOr<std::shared_ptr<const TlsContext>> ForClient(const std::string& ca_file);

  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  SSL_CTX* get() const { return context_; }

 private:
  explicit TlsContext(SSL_CTX* context) : context_(context) {}
  SSL_CTX* const context_;
};

// OpenSSL's queued errors as one line (and the queue cleared); `fallback` when it is empty.
std::string TakeOpenSslErrors(const std::string& fallback);

}  // namespace lamina

#endif  // LAMINA_COMMON_SECURITY_TLS_CONTEXT_H_
