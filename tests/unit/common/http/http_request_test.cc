#include "common/http/http_request.h"

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(HttpRequestTest, ParsesTheRequestLineAndHeaders) {
  absl::StatusOr<HttpRequest> r = ParseRequestHead(
      "\r\nPOST /v1/completions?x=1 HTTP/1.1\r\nHost: here\r\nContent-Type:application/json  \r\nX-Two: a\r\nx-two: b");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->method, "POST");
  EXPECT_EQ(r->target, "/v1/completions?x=1");
  EXPECT_EQ(r->path, "/v1/completions");
  EXPECT_EQ(r->minor_version, 1);
  ASSERT_EQ(r->headers.size(), 4u);
  EXPECT_EQ(*r->Header("content-type"), "application/json");
  EXPECT_EQ(*r->Header("x-two"), "a");  // the first of a repeated header
  EXPECT_EQ(r->Header("content-length"), nullptr);
}

TEST(HttpRequestTest, MalformedHeadsAreRefusedSayingWhatIsWrong) {
  auto message = [](absl::string_view head) {
    absl::StatusOr<HttpRequest> r = ParseRequestHead(head);
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  EXPECT_EQ(message(""), "the request has no request line");
  EXPECT_EQ(message("GET /"), "the request line 'GET /' is not 'METHOD TARGET HTTP/1.1'");
  EXPECT_EQ(message("GET  / HTTP/1.1"), "the request line 'GET  / HTTP/1.1' is not 'METHOD TARGET HTTP/1.1'");
  EXPECT_EQ(message("G(T / HTTP/1.1"), "bad method 'G(T'");
  EXPECT_EQ(message("GET v1 HTTP/1.1"), "the target 'v1' is not a path");
  EXPECT_EQ(message("GET / FTP/1.1"), "bad protocol 'FTP/1.1'");
  EXPECT_EQ(message("GET / HTTP/1.1\r\nNo colon here"), "header line 1 'No colon here' is not 'Name: value'");
  EXPECT_EQ(message("GET / HTTP/1.1\r\nBad Name: x"), "header line 1 'Bad Name: x' is not 'Name: value'");
  EXPECT_EQ(message("GET / HTTP/1.1\r\nA: b\x01"), "header 'A' has a control character");
  absl::StatusOr<HttpRequest> two = ParseRequestHead("GET / HTTP/2.0");
  EXPECT_TRUE(absl::IsUnimplemented(two.status())) << two.status();
}

TEST(HttpRequestTest, KeepAliveFollowsTheVersionAndTheConnectionHeader) {
  EXPECT_TRUE(ParseRequestHead("GET / HTTP/1.1")->KeepAlive());
  EXPECT_FALSE(ParseRequestHead("GET / HTTP/1.1\r\nConnection: Close")->KeepAlive());
  EXPECT_FALSE(ParseRequestHead("GET / HTTP/1.0")->KeepAlive());
  EXPECT_TRUE(ParseRequestHead("GET / HTTP/1.0\r\nConnection: keep-alive")->KeepAlive());
}

TEST(HttpRequestTest, BodyLengthComesFromContentLengthWithinTheLimit) {
  auto length = [](absl::string_view head) { return BodyLength(*ParseRequestHead(head), 100); };
  EXPECT_EQ(*length("POST / HTTP/1.1"), 0u);
  EXPECT_EQ(*length("POST / HTTP/1.1\r\nContent-Length: 42"), 42u);
  EXPECT_EQ(*length("POST / HTTP/1.1\r\nContent-Length: 7\r\nContent-Length: 7"), 7u);
  EXPECT_EQ(length("POST / HTTP/1.1\r\nContent-Length: 7\r\nContent-Length: 8").status().message(),
            "two different Content-Length headers");
  EXPECT_EQ(length("POST / HTTP/1.1\r\nContent-Length: -1").status().message(), "Content-Length '-1' is not a number");
  EXPECT_EQ(length("POST / HTTP/1.1\r\nContent-Length: 101").status().message(),
            "the body has 101 bytes; at most 100 are taken");
  EXPECT_TRUE(absl::IsOutOfRange(length("POST / HTTP/1.1\r\nContent-Length: 101").status()));
  EXPECT_TRUE(absl::IsUnimplemented(length("POST / HTTP/1.1\r\nTransfer-Encoding: chunked").status()));
}

TEST(HttpRequestTest, ResponseHeadsAndChunks) {
  EXPECT_EQ(ResponseHead(200, "application/json", 5, true),
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n");
  EXPECT_EQ(
      ResponseHead(503, "text/plain", 0, false),
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 0\r\nConnection: close\r\n"
      "Retry-After: 1\r\n\r\n");
  EXPECT_EQ(ResponseHead(200, "text/event-stream", std::nullopt, true),
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            "Cache-Control: no-cache\r\n\r\n");
  EXPECT_EQ(Chunk(std::string(26, 'x')), "1a\r\n" + std::string(26, 'x') + "\r\n");
  EXPECT_EQ(kLastChunk, "0\r\n\r\n");
}

}  // namespace
}  // namespace lamina
