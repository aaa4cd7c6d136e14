#include "deploy/bench/openai_sender.h"

#include <mutex>
#include <vector>

#include "common/http/http_server.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lamina::bench {
namespace {

using json = nlohmann::json;

// An OpenAI-compatible server that answers every request with `status` and, for 200, `events` as
// a stream's pieces, else events[0] as the body; it keeps the last request's line and body.
class FakeServer {
 public:
  FakeServer(int status, std::vector<std::string> events) {
    auto server =
        HttpServer::Start("127.0.0.1:0", [this, status, events](const HttpRequest& request, HttpResponder& responder) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            last_ = request.method + " " + request.path + " " + request.body;
          }
          if (status != 200) {
            (void)responder.Send(status, "application/json", events.empty() ? "" : events[0]);
            return;
          }
          (void)responder.StartStream(200, "text/event-stream");
          for (const std::string& event : events) (void)responder.Write(event);
          (void)responder.EndStream();
        });
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  std::string address() const { return server_->address(); }
  std::string last() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

 private:
  std::mutex mu_;
  std::string last_;
  std::unique_ptr<HttpServer> server_;
};

struct Sent {
  absl::Status status;
  std::vector<int> token_calls;
  int prompt_tokens = -1;
};

Sent SendTo(const std::string& address, BenchRequest request) {
  OpenAiSender sender(address, "m");
  Sent sent;
  sent.status = sender.Send(
      request, absl::Seconds(10), [&](int n) { sent.token_calls.push_back(n); }, &sent.prompt_tokens);
  return sent;
}

BenchRequest Ids(std::vector<int32_t> ids, int output) {
  BenchRequest r;
  r.prompt_ids = std::move(ids);
  r.output_tokens = output;
  return r;
}

TEST(OpenAiSenderTest, StreamsTokensAndTakesTheUsagesCounts) {
  // Three choices stream (one event split across writes, CRLF line ends in another); the usage
  // then says four tokens came (a server may put several in one event).
  FakeServer server(
      200,
      {"data: {\"choices\": [{\"index\": 0, \"text\": \"a\"}]}\n\n", "data: {\"choices\": [{\"index\": 0, \"te",
       "xt\": \"b\"}]}\n\n", ": a comment\r\ndata: {\"choices\": [{\"index\": 0, \"text\": \"cd\"}]}\r\n\r\n",
       "data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 4}}\n\n", "data: [DONE]\n\n"});
  const Sent sent = SendTo(server.address(), Ids({5, 6, 7}, 4));
  ASSERT_TRUE(sent.status.ok()) << sent.status;
  EXPECT_EQ(sent.token_calls, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(sent.prompt_tokens, 3);
  const std::string last = server.last();
  ASSERT_EQ(last.rfind("POST /v1/completions ", 0), 0u) << last;
  const json body = json::parse(last.substr(std::string("POST /v1/completions ").size()));
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["prompt"], json::array({5, 6, 7}));
  EXPECT_EQ(body["max_tokens"], 4);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["ignore_eos"], true);

  BenchRequest text;
  text.prompt_text = "hello";
  text.output_tokens = 2;
  ASSERT_TRUE(SendTo(server.address(), text).status.ok());
  EXPECT_NE(server.last().find("\"prompt\":\"hello\""), std::string::npos) << server.last();
}

TEST(OpenAiSenderTest, ErrorsCarryTheServersMessageAndCode) {
  FakeServer refused(400, {R"({"error": {"message": "max_tokens is too large", "type": "invalid_request_error"}})"});
  Sent sent = SendTo(refused.address(), Ids({1}, 1));
  EXPECT_TRUE(absl::IsInvalidArgument(sent.status)) << sent.status;
  EXPECT_NE(sent.status.message().find("answered HTTP 400: max_tokens is too large"), std::string::npos) << sent.status;

  FakeServer busy(503, {"overloaded"});
  sent = SendTo(busy.address(), Ids({1}, 1));
  EXPECT_TRUE(absl::IsUnavailable(sent.status)) << sent.status;
  EXPECT_NE(sent.status.message().find("HTTP 503: overloaded"), std::string::npos) << sent.status;

  FakeServer failing(200,
                     {"data: {\"choices\": [{\"index\": 0, \"text\": \"a\"}]}\n\n",
                      "data: {\"error\": {\"message\": \"memory node 'memory-0' died\"}}\n\n", "data: [DONE]\n\n"});
  sent = SendTo(failing.address(), Ids({1}, 3));
  EXPECT_TRUE(absl::IsUnavailable(sent.status)) << sent.status;
  EXPECT_NE(sent.status.message().find("memory node 'memory-0' died"), std::string::npos) << sent.status;
  EXPECT_EQ(sent.token_calls, (std::vector<int>{1}));

  FakeServer cut(200, {"data: {\"choices\": [{\"index\": 0, \"text\": \"a\"}]}\n\n"});
  sent = SendTo(cut.address(), Ids({1}, 3));
  EXPECT_TRUE(absl::IsUnavailable(sent.status)) << sent.status;
  EXPECT_NE(sent.status.message().find("ended without [DONE]"), std::string::npos) << sent.status;

  FakeServer garbled(200, {"data: {not json\n\n"});
  sent = SendTo(garbled.address(), Ids({1}, 3));
  EXPECT_TRUE(absl::IsDataLoss(sent.status)) << sent.status;
}

TEST(OpenAiSenderTest, TheServersModelAndItsContext) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start("127.0.0.1:0", [](const HttpRequest& request, HttpResponder& responder) {
        (void)responder.Send(200, "application/json",
                             request.path == "/v1/models"
                                 ? R"({"object": "list", "data": [{"id": "llama", "max_model_len": 8192}]})"
                                 : "{}");
      });
  ASSERT_TRUE(server.ok());
  absl::StatusOr<OpenAiModel> model = FetchOpenAiModel((*server)->address(), absl::Seconds(5));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->id, "llama");
  EXPECT_EQ(model->max_context, 8192);

  absl::StatusOr<std::unique_ptr<HttpServer>> empty =
      HttpServer::Start("127.0.0.1:0", [](const HttpRequest&, HttpResponder& responder) {
        (void)responder.Send(200, "application/json", R"({"object": "list", "data": []})");
      });
  ASSERT_TRUE(empty.ok());
  model = FetchOpenAiModel((*empty)->address(), absl::Seconds(5));
  EXPECT_TRUE(absl::IsFailedPrecondition(model.status())) << model.status();
  EXPECT_NE(model.status().message().find("lists no model"), std::string::npos) << model.status();
}

TEST(OpenAiSenderTest, UrlsAreHostAndPortOverHttpOrHttps) {
  EXPECT_EQ(ParseOpenAiUrl("http://127.0.0.1:8000")->address, "127.0.0.1:8000");
  EXPECT_FALSE(ParseOpenAiUrl("http://127.0.0.1:8000")->https);
  EXPECT_EQ(ParseOpenAiUrl("http://gpu-7:8000/v1")->address, "gpu-7:8000");
  EXPECT_EQ(ParseOpenAiUrl("http://gpu-7:8000/")->address, "gpu-7:8000");
  EXPECT_EQ(ParseOpenAiUrl("localhost:50150")->address, "localhost:50150");
  absl::StatusOr<OpenAiUrl> https = ParseOpenAiUrl("https://api.example.com:443/v1");
  ASSERT_TRUE(https.ok());
  EXPECT_EQ(https->address, "api.example.com:443");
  EXPECT_TRUE(https->https);
  EXPECT_FALSE(ParseOpenAiUrl("http://host").ok()) << "no port";
  EXPECT_FALSE(ParseOpenAiUrl("http://host:80/v1/completions").ok()) << "a path";
}

}  // namespace
}  // namespace lamina::bench
