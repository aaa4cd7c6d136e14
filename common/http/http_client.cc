#include "common/http/http_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net/sockets.h"
#include "common/status/status_macros.h"

namespace lamina {
namespace {

constexpr size_t kMaxHeadBytes = 64 * 1024;
constexpr size_t kMaxChunkBytes = size_t{1} << 30;

}  // namespace

absl::StatusOr<std::unique_ptr<HttpResponseStream>> HttpResponseStream::Open(
    const std::string& address, const std::string& method, const std::string& path, const std::string& body,
    const std::string& content_type, absl::Time deadline, const HttpClientOptions& options) {
  LAMINA_ASSIGN_OR_RETURN(int fd, ConnectTcp(address, deadline));
  std::unique_ptr<HttpResponseStream> stream(new HttpResponseStream(fd, address, deadline));
  if (options.tls != nullptr) {
    const std::string host = address.substr(0, address.rfind(':'));
    LAMINA_ASSIGN_OR_RETURN(stream->stream_, SocketStream::ConnectTls(fd, address, host, options.tls, deadline));
  } else {
    stream->stream_ = SocketStream::Plain(fd, address);
  }
  std::string request =
      absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: ", address, "\r\nConnection: close\r\nAccept: */*\r\n");
  if (!options.api_key.empty()) absl::StrAppend(&request, "Authorization: Bearer ", options.api_key, "\r\n");
  if (!body.empty() || method == "POST") {
    if (!content_type.empty()) absl::StrAppend(&request, "Content-Type: ", content_type, "\r\n");
    absl::StrAppend(&request, "Content-Length: ", body.size(), "\r\n");
  }
  absl::StrAppend(&request, "\r\n", body);
  LAMINA_RETURN_IF_ERROR(stream->stream_->Write(request, deadline));
  LAMINA_RETURN_IF_ERROR(stream->ReadHead());
  return stream;
}

HttpResponseStream::~HttpResponseStream() {
  stream_.reset();  // a TLS stream's goodbye goes over the descriptor
  ::close(fd_);
}

absl::StatusOr<bool> HttpResponseStream::Receive() {
  char bytes[64 * 1024];
  LAMINA_ASSIGN_OR_RETURN(size_t n, stream_->Read(bytes, sizeof(bytes), deadline_));
  buffer_.append(bytes, n);
  return n > 0;
}

absl::Status HttpResponseStream::ReceiveAtLeast(size_t bytes, const char* what) {
  while (buffer_.size() < bytes) {
    LAMINA_ASSIGN_OR_RETURN(bool more, Receive());
    if (!more) return absl::UnavailableError(absl::StrCat(peer_, " closed the connection in the middle of ", what));
  }
  return absl::OkStatus();
}

absl::Status HttpResponseStream::ReadHead() {
  size_t end;
  while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
    if (buffer_.size() > kMaxHeadBytes)
      return absl::DataLossError(absl::StrCat(peer_, ": the response head is too large"));
    LAMINA_ASSIGN_OR_RETURN(bool more, Receive());
    if (!more) {
      return absl::UnavailableError(
          absl::StrCat(peer_, " closed the connection before answering", buffer_.empty() ? "" : " in full"));
    }
  }
  const std::string head = buffer_.substr(0, end);
  buffer_.erase(0, end + 4);
  std::vector<std::string> lines = absl::StrSplit(head, "\r\n");
  headers_.clear();  // an interim response's are not the final one's
  // "HTTP/1.1 200 OK"
  const std::vector<std::string> status_line = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  if (status_line.size() < 2 || !absl::StartsWith(status_line[0], "HTTP/1.") ||
      !absl::SimpleAtoi(status_line[1], &status_) || status_ < 100 || status_ > 999) {
    return absl::DataLossError(absl::StrCat(peer_, " did not answer in HTTP/1.x: '", lines[0], "'"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) {
      return absl::DataLossError(absl::StrCat(peer_, ": a malformed header line: '", lines[i], "'"));
    }
    const std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    headers_.emplace(name, std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1))));
  }
  if (status_ < 200) return ReadHead();  // an interim response; the real one follows
  if (status_ == 204 || status_ == 304) {
    ended_ = true;
  } else if (headers_.count("transfer-encoding") > 0) {
    if (!absl::StrContains(absl::AsciiStrToLower(headers_["transfer-encoding"]), "chunked")) {
      return absl::DataLossError(
          absl::StrCat(peer_, ": unknown Transfer-Encoding '", headers_["transfer-encoding"], "'"));
    }
    framing_ = Framing::kChunked;
  } else if (headers_.count("content-length") > 0) {
    if (!absl::SimpleAtoi(headers_["content-length"], &remaining_)) {
      return absl::DataLossError(
          absl::StrCat(peer_, ": a malformed Content-Length '", headers_["content-length"], "'"));
    }
    framing_ = Framing::kLength;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> HttpResponseStream::Read() {
  if (ended_) return std::string();
  switch (framing_) {
    case Framing::kLength: {
      if (remaining_ == 0) {
        ended_ = true;
        return std::string();
      }
      LAMINA_RETURN_IF_ERROR(ReceiveAtLeast(1, "the body"));
      std::string piece = buffer_.substr(0, remaining_);
      buffer_.erase(0, piece.size());
      remaining_ -= piece.size();
      return piece;
    }
    case Framing::kUntilClose: {
      if (buffer_.empty()) {
        LAMINA_ASSIGN_OR_RETURN(bool more, Receive());
        if (!more) {
          ended_ = true;
          return std::string();
        }
      }
      std::string piece;
      piece.swap(buffer_);
      return piece;
    }
    case Framing::kChunked: {
      size_t line_end;
      while ((line_end = buffer_.find("\r\n")) == std::string::npos) {
        if (buffer_.size() > 1024) return absl::DataLossError(absl::StrCat(peer_, ": a malformed chunk size line"));
        LAMINA_RETURN_IF_ERROR(ReceiveAtLeast(buffer_.size() + 1, "a chunked body"));
      }
      const std::string size_text(absl::StripAsciiWhitespace(buffer_.substr(0, buffer_.find_first_of(";\r"))));
      uint64_t size = 0;
      if (size_text.empty() || !absl::SimpleHexAtoi(size_text, &size) || size > kMaxChunkBytes) {
        return absl::DataLossError(absl::StrCat(peer_, ": a malformed chunk size '", size_text, "'"));
      }
      if (size == 0) {  // the last chunk; trailers, if any, are not read
        ended_ = true;
        return std::string();
      }
      LAMINA_RETURN_IF_ERROR(ReceiveAtLeast(line_end + 2 + size + 2, "a chunk"));
      std::string data = buffer_.substr(line_end + 2, size);
      if (buffer_.compare(line_end + 2 + size, 2, "\r\n") != 0) {
        return absl::DataLossError(absl::StrCat(peer_, ": a chunk does not end where its size says"));
      }
      buffer_.erase(0, line_end + 2 + size + 2);
      return data;
    }
  }
  return std::string();
}

absl::StatusOr<std::string> HttpResponseStream::ReadAll() {
  std::string body;
  for (;;) {
    LAMINA_ASSIGN_OR_RETURN(std::string piece, Read());
    if (piece.empty()) return body;
    body += piece;
  }
}

}  // namespace lamina
