// A plain HTTP/1.1 client for tests of Lamina's HTTP servers: whole calls, and the pieces to write
// raw requests on a socket and read what comes back.
#ifndef LAMINA_TESTS_SUPPORT_HTTP_CLIENT_H_
#define LAMINA_TESTS_SUPPORT_HTTP_CLIENT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace lamina::testing {

struct HttpReply {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lowercase
  std::string body;                            // chunked bodies decoded
};

// One request with "Connection: close" (and a Content-Length when `body` is not empty); reads the
// whole reply.
absl::StatusOr<HttpReply> HttpCall(const std::string& address, const std::string& method, const std::string& path,
                                   const std::string& body = "", absl::Duration timeout = absl::Seconds(60));

// Sends all of `bytes` on a connected socket.
absl::Status SendBytes(int fd, const std::string& bytes);
// Reads until the server closes the connection, or fails at `timeout`.
absl::StatusOr<std::string> ReadUntilClosed(int fd, absl::Duration timeout);
// Every response in `raw`, in order (interim 100 responses included).
absl::StatusOr<std::vector<HttpReply>> ParseHttpReplies(const std::string& raw);
// The data of each server-sent event in `body` ("data: X" lines).
std::vector<std::string> SseData(const std::string& body);

}  // namespace lamina::testing

#endif  // LAMINA_TESTS_SUPPORT_HTTP_CLIENT_H_
