#include "common/http/http_request.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace lamina {
namespace {

// RFC 9110's token characters, which a method and a header name are made of.
bool IsTokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         absl::string_view("!#$%&'*+-.^_`|~").find(c) != absl::string_view::npos;
}

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

std::string Quoted(absl::string_view s) {
  constexpr size_t kShown = 60;
  std::string shown(s.substr(0, kShown));
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return absl::StrCat("'", shown, s.size() > kShown ? "...'" : "'");
}

}  // namespace

const std::string* HttpRequest::Header(absl::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (key == name) return &value;
  }
  return nullptr;
}

bool HttpRequest::KeepAlive() const {
  const std::string* connection = Header("connection");
  const std::string value = connection ? absl::AsciiStrToLower(*connection) : "";
  if (minor_version == 0) return value == "keep-alive";
  return value != "close";
}

absl::StatusOr<HttpRequest> ParseRequestHead(absl::string_view head) {
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  // Empty lines before the request line are allowed (RFC 9112, 2.2).
  size_t first = 0;
  while (first < lines.size() && lines[first].empty()) ++first;
  if (first == lines.size()) return absl::InvalidArgumentError("the request has no request line");

  HttpRequest request;
  std::vector<absl::string_view> parts = absl::StrSplit(lines[first], ' ');
  if (parts.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request line ", Quoted(lines[first]), " is not 'METHOD TARGET HTTP/1.1'"));
  }
  if (!IsToken(parts[0])) return absl::InvalidArgumentError(absl::StrCat("bad method ", Quoted(parts[0])));
  if (parts[1].empty() || parts[1][0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("the target ", Quoted(parts[1]), " is not a path"));
  }
  for (char c : parts[1]) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError("the target has a control character");
    }
  }
  if (parts[2] == "HTTP/1.1") {
    request.minor_version = 1;
  } else if (parts[2] == "HTTP/1.0") {
    request.minor_version = 0;
  } else if (absl::StartsWith(parts[2], "HTTP/")) {
    return absl::UnimplementedError(
        absl::StrCat("HTTP version ", Quoted(parts[2]), " is not served (1.0 and 1.1 are)"));
  } else {
    return absl::InvalidArgumentError(absl::StrCat("bad protocol ", Quoted(parts[2])));
  }
  request.method = std::string(parts[0]);
  request.target = std::string(parts[1]);
  request.path = request.target.substr(0, request.target.find('?'));

  for (size_t i = first + 1; i < lines.size(); ++i) {
    absl::string_view line = lines[i];
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || !IsToken(line.substr(0, colon))) {
      return absl::InvalidArgumentError(
          absl::StrCat("header line ", i - first, " ", Quoted(line), " is not 'Name: value'"));
    }
    absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    for (char c : value) {
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
        return absl::InvalidArgumentError(
            absl::StrCat("header ", Quoted(line.substr(0, colon)), " has a control character"));
      }
    }
    request.headers.emplace_back(absl::AsciiStrToLower(line.substr(0, colon)), std::string(value));
  }
  return request;
}

absl::StatusOr<size_t> BodyLength(const HttpRequest& request, size_t max_bytes) {
  if (request.Header("transfer-encoding") != nullptr) {
    return absl::UnimplementedError("a chunked request body is not taken: send Content-Length");
  }
  std::optional<size_t> length;
  for (const auto& [key, value] : request.headers) {
    if (key != "content-length") continue;
    uint64_t parsed = 0;
    if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos ||
        !absl::SimpleAtoi(value, &parsed)) {
      return absl::InvalidArgumentError(absl::StrCat("Content-Length ", Quoted(value), " is not a number"));
    }
    if (length && *length != parsed) return absl::InvalidArgumentError("two different Content-Length headers");
    length = parsed;
  }
  if (length && *length > max_bytes) {
    return absl::OutOfRangeError(absl::StrCat("the body has ", *length, " bytes; at most ", max_bytes, " are taken"));
  }
  return length.value_or(0);
}

const char* ReasonPhrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 417:
      return "Expectation Failed";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

std::string ResponseHead(int status, absl::string_view content_type, std::optional<size_t> content_length,
                         bool keep_alive) {
  std::string head = absl::StrCat("HTTP/1.1 ", status, " ", ReasonPhrase(status), "\r\n");
  if (!content_type.empty()) absl::StrAppend(&head, "Content-Type: ", content_type, "\r\n");
  if (content_length) {
    absl::StrAppend(&head, "Content-Length: ", *content_length, "\r\n");
  } else {
    absl::StrAppend(&head, "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n");
  }
  if (!keep_alive) absl::StrAppend(&head, "Connection: close\r\n");
  if (status == 503) absl::StrAppend(&head, "Retry-After: 1\r\n");  // our 503s pass: a node comes back, a drain ends
  absl::StrAppend(&head, "\r\n");
  return head;
}

std::string Chunk(absl::string_view data) { return absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n"); }

}  // namespace lamina
