// A blocking HTTP/1.1 client for one request on a connection of its own ("Connection: close"),
// whose response body is read as it arrives (server-sent events come a piece at a time). Every
// wait ends at the call's deadline. `lamina bench --openai` drives OpenAI-compatible servers with
// it, Lamina's or another's.
// Thread-compatible: a stream is used by one thread at a time.
#ifndef LAMINA_COMMON_HTTP_HTTP_CLIENT_H_
#define LAMINA_COMMON_HTTP_HTTP_CLIENT_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/net/socket_stream.h"
#include "common/security/tls_context.h"

namespace lamina {

struct HttpClientOptions {
  std::string api_key;  // sent as `Authorization: Bearer KEY` when not empty
  // HTTPS with this client context (TlsContext::ForClient), the server's name checked against
  // the address's host; null: plain HTTP.
  std::shared_ptr<const TlsContext> tls;
};

class HttpResponseStream {
 public:
  // Connects to `address` (host:port), sends the request (with a Content-Length, and the
  // Content-Type when `body` is not empty) and reads the response's head. Unavailable when the
  // server cannot be reached or closes the connection early, DeadlineExceeded at `deadline`,
  // DataLoss for a response that is not HTTP/1.x; over TLS, Unavailable when the server's
  // certificate is not trusted.
  static absl::StatusOr<std::unique_ptr<HttpResponseStream>> Open(const std::string& address, const std::string& method,
                                                                  const std::string& path, const std::string& body,
                                                                  const std::string& content_type, absl::Time deadline,
                                                                  const HttpClientOptions& options = {});
  ~HttpResponseStream();  // closes the connection
  HttpResponseStream(const HttpResponseStream&) = delete;
  HttpResponseStream& operator=(const HttpResponseStream&) = delete;

  int status() const { return status_; }
  // The first value of each header, names in lowercase.
  const std::map<std::string, std::string>& headers() const { return headers_; }

  // The body's next bytes as they come (a chunked body decoded); empty once the body has ended.
  absl::StatusOr<std::string> Read();
  // The rest of the body.
  absl::StatusOr<std::string> ReadAll();

 private:
  enum class Framing { kLength, kChunked, kUntilClose };

  HttpResponseStream(int fd, std::string peer, absl::Time deadline) : fd_(fd), peer_(peer), deadline_(deadline) {}
  // Receives more bytes into `buffer_`; false when the server closed the connection.
  absl::StatusOr<bool> Receive();
  // Receives until `buffer_` holds `bytes` bytes; Unavailable if the connection closes first.
  absl::Status ReceiveAtLeast(size_t bytes, const char* what);
  absl::Status ReadHead();

  const int fd_;  // owned
  const std::string peer_;
  const absl::Time deadline_;
  std::unique_ptr<SocketStream> stream_;  // over fd_
  std::string buffer_;  // received and not yet returned
  int status_ = 0;
  std::map<std::string, std::string> headers_;
  Framing framing_ = Framing::kUntilClose;
  size_t remaining_ = 0;  // kLength: body bytes still to come
  bool ended_ = false;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_HTTP_HTTP_CLIENT_H_
