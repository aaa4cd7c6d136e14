// HTTP/1.1 messages as the server reads and writes them (RFC 9112): a request's head parsed into
// method, target and headers, its body length, and response heads. Pure functions over bytes, so
// the parsing is tested without sockets. Limits on sizes are the server's (http_server.h).
#ifndef LAMINA_COMMON_HTTP_HTTP_REQUEST_H_
#define LAMINA_COMMON_HTTP_HTTP_REQUEST_H_

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lamina {

struct HttpRequest {
  std::string method;                                        // as sent, e.g. "GET", "POST"
  std::string target;                                        // as sent, e.g. "/v1/models?x=1"
  std::string path;                                          // the target up to its query
  int minor_version = 1;                                     // HTTP/1.x
  std::vector<std::pair<std::string, std::string>> headers;  // names in lowercase, values trimmed
  std::string body;

  // The first value of the header `name` (lowercase), or nullptr.
  const std::string* Header(absl::string_view name) const;
  // Whether the client keeps the connection open after the response: HTTP/1.1 unless it says
  // "Connection: close", HTTP/1.0 only when it says "Connection: keep-alive".
  bool KeepAlive() const;
};

// Parses a request head: the request line and the header lines, each ending in CRLF, without the
// empty line that ends the head. InvalidArgument names what is malformed; a version other than
// HTTP/1.0 or 1.1 is Unimplemented.
absl::StatusOr<HttpRequest> ParseRequestHead(absl::string_view head);

// The body's length in bytes from Content-Length (0 without one). InvalidArgument for a
// malformed or repeated-and-different length; Unimplemented for a Transfer-Encoding (chunked
// request bodies are refused with 411, as clients then send a length); OutOfRange past
// `max_bytes`.
absl::StatusOr<size_t> BodyLength(const HttpRequest& request, size_t max_bytes);

// The standard reason phrase of a status code Lamina sends ("OK", "Bad Request", ...); "Unknown"
// for others.
const char* ReasonPhrase(int status);

// A response head, up to and including the empty line. With `content_length` the body follows
// whole; without, it follows in chunks (Transfer-Encoding: chunked). `keep_alive` false adds
// "Connection: close".
std::string ResponseHead(int status, absl::string_view content_type, std::optional<size_t> content_length,
                         bool keep_alive);

// One chunk of a chunked body (`data` must not be empty: an empty chunk ends the body).
std::string Chunk(absl::string_view data);
inline constexpr absl::string_view kLastChunk = "0\r\n\r\n";

}  // namespace lamina

#endif  // LAMINA_COMMON_HTTP_HTTP_REQUEST_H_
