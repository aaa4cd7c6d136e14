#include "tests/support/http_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net/sockets.h"
#include "common/status/status_macros.h"

namespace lamina::testing {
namespace {

// Reads one response from `raw` at `*at`, moving `*at` past it.
absl::StatusOr<HttpReply> ParseOne(const std::string& raw, size_t* at) {
  const size_t head_end = raw.find("\r\n\r\n", *at);
  if (head_end == std::string::npos) return absl::DataLossError("a response head is cut short");
  std::vector<std::string> lines = absl::StrSplit(raw.substr(*at, head_end - *at), "\r\n");
  HttpReply reply;
  std::vector<std::string> status_line = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &reply.status)) {
    return absl::DataLossError(absl::StrCat("bad status line '", lines[0], "'"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) return absl::DataLossError(absl::StrCat("bad header '", lines[i], "'"));
    reply.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  size_t pos = head_end + 4;
  if (reply.status == 100) {
    *at = pos;
    return reply;
  }
  if (reply.headers.count("transfer-encoding")) {
    for (;;) {
      const size_t line_end = raw.find("\r\n", pos);
      if (line_end == std::string::npos) return absl::DataLossError("a chunk size is cut short");
      size_t size = 0;
      if (!absl::SimpleHexAtoi(raw.substr(pos, line_end - pos), &size)) {
        return absl::DataLossError(absl::StrCat("bad chunk size at byte ", pos));
      }
      pos = line_end + 2;
      if (size == 0) {
        pos += 2;  // the empty line after the last chunk
        break;
      }
      if (pos + size + 2 > raw.size()) return absl::DataLossError("a chunk is cut short");
      reply.body += raw.substr(pos, size);
      pos += size + 2;
    }
  } else if (reply.headers.count("content-length")) {
    size_t length = 0;
    if (!absl::SimpleAtoi(reply.headers["content-length"], &length)) return absl::DataLossError("bad Content-Length");
    if (pos + length > raw.size()) return absl::DataLossError("a body is cut short");
    reply.body = raw.substr(pos, length);
    pos += length;
  } else {
    reply.body = raw.substr(pos);
    pos = raw.size();
  }
  *at = pos;
  return reply;
}

}  // namespace

absl::Status SendBytes(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("send failed: ", std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadUntilClosed(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string out;
  char buffer[16 << 10];
  for (;;) {
    LAMINA_RETURN_IF_ERROR(WaitForSocket(fd, POLLIN, deadline, "the server"));
    ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == ECONNRESET) return out;
    if (n < 0) return absl::UnavailableError(absl::StrCat("recv failed: ", std::strerror(errno)));
    if (n == 0) return out;
    out.append(buffer, static_cast<size_t>(n));
  }
}

absl::StatusOr<std::vector<HttpReply>> ParseHttpReplies(const std::string& raw) {
  std::vector<HttpReply> replies;
  size_t at = 0;
  while (at < raw.size()) {
    LAMINA_ASSIGN_OR_RETURN(HttpReply reply, ParseOne(raw, &at));
    replies.push_back(std::move(reply));
  }
  return replies;
}

absl::StatusOr<HttpReply> HttpCall(const std::string& address, const std::string& method, const std::string& path,
                                   const std::string& body, absl::Duration timeout) {
  LAMINA_ASSIGN_OR_RETURN(int fd, ConnectTcp(address, absl::Now() + timeout));
  std::string request = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: ", address, "\r\nConnection: close\r\n");
  if (!body.empty()) {
    absl::StrAppend(&request, "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n");
  }
  absl::StrAppend(&request, "\r\n", body);
  absl::Status sent = SendBytes(fd, request);
  absl::StatusOr<std::string> raw = sent.ok() ? ReadUntilClosed(fd, timeout) : absl::StatusOr<std::string>(sent);
  ::close(fd);
  if (!raw.ok()) return raw.status();
  LAMINA_ASSIGN_OR_RETURN(std::vector<HttpReply> replies, ParseHttpReplies(*raw));
  if (replies.size() != 1) return absl::DataLossError(absl::StrCat(replies.size(), " responses to one request"));
  return replies[0];
}

std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> data;
  for (absl::string_view event : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    if (absl::StartsWith(event, "data: ")) data.emplace_back(event.substr(6));
  }
  return data;
}

}  // namespace lamina::testing
