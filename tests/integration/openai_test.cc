// OpenAI's HTTP API on a real cluster: completions and chats give what the gRPC API gives for the
// same request, whole or streamed; bad requests fail alone with OpenAI's error body; a client
// that hangs up frees its request's KV slots; /metrics follows what the requests did.
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/net/sockets.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/chat_model.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/requests_in_flight.h"
#include "tests/support/http_client.h"
#include "tests/support/prometheus_page.h"

namespace lamina::testing {
namespace {

using json = nlohmann::json;

constexpr char kPrompt[] = "In this paper, we";

// POSTs `body` to `path`; the reply's status and its body as JSON (null when not JSON).
std::pair<int, json> Post(const ClusterHarness& cluster, const std::string& path, const json& body) {
  absl::StatusOr<HttpReply> reply = HttpCall(cluster.http_address(), "POST", path, body.dump());
  EXPECT_TRUE(reply.ok()) << reply.status();
  if (!reply.ok()) return {0, nullptr};
  return {reply->status, json::parse(reply->body, nullptr, /*allow_exceptions=*/false)};
}

// The streamed events of POST `path` with `body`: each event's JSON, then whether [DONE] ended them.
std::pair<std::vector<json>, bool> PostStream(const ClusterHarness& cluster, const std::string& path, json body) {
  body["stream"] = true;
  absl::StatusOr<HttpReply> reply = HttpCall(cluster.http_address(), "POST", path, body.dump());
  EXPECT_TRUE(reply.ok()) << reply.status();
  if (!reply.ok()) return {{}, false};
  EXPECT_EQ(reply->status, 200) << reply->body;
  EXPECT_EQ(reply->headers["content-type"], "text/event-stream");
  std::vector<std::string> data = SseData(reply->body);
  const bool done = !data.empty() && data.back() == "[DONE]";
  if (done) data.pop_back();
  std::vector<json> events;
  for (const std::string& d : data) events.push_back(json::parse(d));
  return {events, done};
}

// The text of each choice of a stream, joined.
std::vector<std::string> StreamedTexts(const std::vector<json>& events, bool chat) {
  std::vector<std::string> texts;
  for (const json& event : events) {
    for (const json& choice : event["choices"]) {
      const size_t index = choice["index"].get<size_t>();
      if (texts.size() <= index) texts.resize(index + 1);
      if (chat) {
        if (choice["delta"].contains("content")) texts[index] += choice["delta"]["content"].get<std::string>();
      } else {
        texts[index] += choice["text"].get<std::string>();
      }
    }
  }
  return texts;
}

lamina::v1::GenerateRequest TextRequest(const std::string& text, int max_tokens) {
  lamina::v1::GenerateRequest r;
  r.set_text(text);
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  return r;
}

class OpenAiClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new TempDir();
    WriteChatModel(*model_);
    ClusterOptions options;
    options.model = model_->path();
    options.http = true;
    options.prefix_caching = false;  // so that a finished request leaves no slots in use
    auto cluster = ClusterHarness::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    delete model_;
  }
  static ClusterHarness& cluster() { return *cluster_; }
  // The model's name, as the API knows it: its folder's.
  static std::string ModelName() { return model_->path().substr(model_->path().rfind('/') + 1); }

  static TempDir* model_;
  static ClusterHarness* cluster_;
};
TempDir* OpenAiClusterTest::model_ = nullptr;
ClusterHarness* OpenAiClusterTest::cluster_ = nullptr;

TEST_F(OpenAiClusterTest, CompletionsGiveTheGrpcApisTextWholeAndStreamed) {
  const Outcome grpc = Generate(cluster().client(), TextRequest(kPrompt, 24));
  ASSERT_TRUE(grpc.status.ok()) << grpc.status;
  const json body = {{"model", ModelName()}, {"prompt", kPrompt},  {"max_tokens", 24},
                     {"temperature", 0},     {"ignore_eos", true}, {"logprobs", 2}};

  const auto [status, whole] = Post(cluster(), "/v1/completions", body);
  ASSERT_EQ(status, 200) << whole.dump();
  EXPECT_EQ(whole["object"], "text_completion");
  EXPECT_EQ(whole["model"], ModelName());
  ASSERT_EQ(whole["choices"].size(), 1u);
  EXPECT_EQ(whole["choices"][0]["text"], grpc.text);
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole["usage"]["completion_tokens"], 24);
  EXPECT_EQ(whole["usage"]["prompt_tokens"], 8);  // BOS and 7 tokens
  EXPECT_EQ(whole["usage"]["total_tokens"], 32);
  const json& logprobs = whole["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["token_logprobs"].size(), 24u);
  for (const json& top : logprobs["top_logprobs"]) EXPECT_EQ(top.size(), 2u);
  std::string joined;
  for (const json& token : logprobs["tokens"]) joined += token.get<std::string>();
  EXPECT_EQ(joined, grpc.text);
  EXPECT_EQ(logprobs["text_offset"][1], logprobs["tokens"][0].get<std::string>().size());

  json streamed_body = body;
  streamed_body["stream_options"] = {{"include_usage", true}};
  const auto [events, done] = PostStream(cluster(), "/v1/completions", streamed_body);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(StreamedTexts(events, false), std::vector<std::string>{grpc.text});
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_EQ(events.back()["usage"], whole["usage"]);
  for (const json& event : events) EXPECT_EQ(event["id"], events[0]["id"]);
}

TEST_F(OpenAiClusterTest, SeveralPromptsAndSamplesBecomeChoicesInOrder) {
  const std::vector<std::string> prompts = {kPrompt, "The memory devices"};
  const json body = {{"prompt", prompts}, {"max_tokens", 12}, {"temperature", 0.8},
                     {"seed", 5},         {"n", 2},           {"ignore_eos", true}};
  const auto [status, whole] = Post(cluster(), "/v1/completions", body);
  ASSERT_EQ(status, 200) << whole.dump();
  ASSERT_EQ(whole["choices"].size(), 4u);
  const auto [events, done] = PostStream(cluster(), "/v1/completions", body);
  EXPECT_TRUE(done);
  const std::vector<std::string> streamed = StreamedTexts(events, false);
  ASSERT_EQ(streamed.size(), 4u);
  for (int p = 0; p < 2; ++p) {
    for (int k = 0; k < 2; ++k) {
      // Sample k of n draws with seed + k, as one request of that seed does.
      lamina::v1::GenerateRequest one = TextRequest(prompts[p], 12);
      one.mutable_sampling()->set_temperature(0.8f);
      one.mutable_sampling()->set_seed(5 + k);
      const Outcome grpc = Generate(cluster().client(), one);
      ASSERT_TRUE(grpc.status.ok()) << grpc.status;
      const int index = p * 2 + k;
      EXPECT_EQ(whole["choices"][index]["index"], index);
      EXPECT_EQ(whole["choices"][index]["text"], grpc.text) << "prompt " << p << " sample " << k;
      EXPECT_EQ(streamed[index], grpc.text) << "prompt " << p << " sample " << k;
    }
  }
  EXPECT_EQ(whole["usage"]["completion_tokens"], 48);
}

TEST_F(OpenAiClusterTest, ChatsGoThroughTheModelsTemplate) {
  lamina::v1::GenerateRequest request;
  for (const auto& [role, content] : std::vector<std::pair<std::string, std::string>>{
           {"system", "Answer in one line."}, {"user", "Why split the model at attention?"}}) {
    lamina::v1::ChatMessage* m = request.mutable_chat()->add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  request.set_max_tokens(16);
  request.set_ignore_eos(true);
  const Outcome grpc = Generate(cluster().client(), request);
  ASSERT_TRUE(grpc.status.ok()) << grpc.status;

  const json body = {
      {"messages",
       json::array({{{"role", "system"}, {"content", "Answer in one line."}},
                    {{"role", "user"},
                     {"content", json::array({{{"type", "text"}, {"text", "Why split "}},
                                              {{"type", "text"}, {"text", "the model at attention?"}}})}}})},
      {"max_tokens", 16},
      {"temperature", 0},
      {"ignore_eos", true}};
  const auto [status, whole] = Post(cluster(), "/v1/chat/completions", body);
  ASSERT_EQ(status, 200) << whole.dump();
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], grpc.text);
  EXPECT_EQ(whole["usage"]["completion_tokens"], 16);

  const auto [events, done] = PostStream(cluster(), "/v1/chat/completions", body);
  EXPECT_TRUE(done);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(StreamedTexts(events, true), std::vector<std::string>{grpc.text});
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");
}

TEST_F(OpenAiClusterTest, BadRequestsFailAloneWithOpenAisErrorBody) {
  auto error = [&](const std::string& path, const json& body) {
    const auto [status, reply] = Post(cluster(), path, body);
    return std::make_pair(status, reply.contains("error") ? reply["error"] : json(reply));
  };
  auto [status, e] = error("/v1/completions", {{"prompt", "x"}, {"temperature", "hot"}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["message"], "'temperature': expected a number, got \"hot\"");
  EXPECT_EQ(e["param"], "temperature");
  EXPECT_EQ(e["type"], "invalid_request_error");

  std::tie(status, e) = error("/v1/completions", {{"model", "gpt-4"}, {"prompt", "x"}});
  EXPECT_EQ(status, 404);
  EXPECT_EQ(e["code"], "model_not_found");

  std::tie(status, e) = error("/v1/completions", {{"prompt", std::vector<int>(2000, 5)}, {"max_tokens", 1}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["message"], "the prompt has 2000 tokens; the model's context is 1024 tokens");
  // As vLLM: a completion that cannot fit in the context is refused, not cut short.
  std::tie(status, e) = error("/v1/completions", {{"prompt", std::vector<int>(1000, 5)}, {"max_tokens", 30}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["param"], "max_tokens");
  EXPECT_EQ(e["message"],
            "this model's maximum context length is 1024 tokens, but 1000 prompt tokens and max_tokens 30 make "
            "1030; lower max_tokens to at most 24");

  std::tie(status, e) =
      error("/v1/chat/completions", {{"messages", json::array({{{"role", "assistant"}, {"content", "Hello."}}})}});
  EXPECT_EQ(status, 400);
  EXPECT_NE(e["message"].get<std::string>().find("Conversation roles must alternate user/assistant"), std::string::npos)
      << e.dump();

  absl::StatusOr<HttpReply> not_json = HttpCall(cluster().http_address(), "POST", "/v1/completions", "{prompt");
  ASSERT_TRUE(not_json.ok());
  EXPECT_EQ(not_json->status, 400);
  // A prompt nested 100,000 arrays deep (once a crash): refused before it is parsed.
  const std::string nested = "{\"prompt\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  absl::StatusOr<HttpReply> deep = HttpCall(cluster().http_address(), "POST", "/v1/completions", nested);
  ASSERT_TRUE(deep.ok()) << deep.status();
  EXPECT_EQ(deep->status, 400);
  EXPECT_NE(deep->body.find("nested deeper than 32 levels"), std::string::npos) << deep->body;
  // A text prompt past what the model's context could take is refused before it is tokenized.
  std::tie(status, e) = error("/v1/completions", {{"prompt", std::string(1 << 20, 'a')}, {"max_tokens", 1}});
  EXPECT_EQ(status, 400);
  EXPECT_NE(e["message"].get<std::string>().find("text: 1048576 bytes; at most 65536"), std::string::npos)
      << e.dump();
  absl::StatusOr<HttpReply> wrong_method = HttpCall(cluster().http_address(), "GET", "/v1/completions");
  ASSERT_TRUE(wrong_method.ok());
  EXPECT_EQ(wrong_method->status, 405);

  absl::StatusOr<HttpReply> models = HttpCall(cluster().http_address(), "GET", "/v1/models");
  ASSERT_TRUE(models.ok());
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], ModelName());
  absl::StatusOr<HttpReply> health = HttpCall(cluster().http_address(), "GET", "/health");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, 200);
  // And the cluster still serves.
  const auto [ok_status, ok] = Post(cluster(), "/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 2}});
  EXPECT_EQ(ok_status, 200) << ok.dump();
}

TEST_F(OpenAiClusterTest, AClientThatHangsUpFreesItsRequestsSlots) {
  auto used = [&] {
    int64_t total = 0;
    auto status = cluster().client().Status(absl::Seconds(1));
    for (const auto& n : status->nodes()) total += n.kv_used_slots();
    return total;
  };
  auto decoded = [&] { return cluster().client().Status(absl::Seconds(1))->decoded_sequences(); };
  auto wait_until = [&](auto done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (!done() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    return done();
  };
  ASSERT_TRUE(wait_until([&] { return used() == 0; }));
  for (const bool stream : {true, false}) {
    const json body = {{"prompt", kPrompt}, {"max_tokens", 1000}, {"ignore_eos", true}, {"stream", stream}};
    const std::string text = body.dump();
    const int64_t decoded_before = decoded();
    absl::StatusOr<int> fd = ConnectTcp(cluster().http_address(), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(fd.ok());
    ASSERT_TRUE(
        SendBytes(*fd, absl::StrCat("POST /v1/completions HTTP/1.1\r\nContent-Length: ", text.size(), "\r\n\r\n", text))
            .ok());
    // Memory nodes report their use with each heartbeat (every 100 ms here).
    EXPECT_TRUE(wait_until([&] { return used() >= 20; })) << "stream " << stream << ": the request never ran";
    ::close(*fd);
    EXPECT_TRUE(wait_until([&] { return used() == 0; })) << "stream " << stream << ": hanging up must free the slots";
    // Cancelled, not run to its end: far fewer than its 1000 tokens were decoded.
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_LT(decoded() - decoded_before, 500) << "stream " << stream;
  }
}

// The cluster's /metrics page, read as a scraper reads it.
std::map<std::string, double> Scrape(const ClusterHarness& cluster) {
  absl::StatusOr<HttpReply> reply = HttpCall(cluster.http_address(), "GET", "/metrics");
  EXPECT_TRUE(reply.ok()) << reply.status();
  if (!reply.ok()) return {};
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  absl::StatusOr<std::map<std::string, double>> page = ParsePrometheusPage(reply->body);
  EXPECT_TRUE(page.ok()) << page.status() << "\n" << reply->body;
  return page.ok() ? *page : std::map<std::string, double>();
}

TEST_F(OpenAiClusterTest, MetricsFollowWhatRequestsDid) {
  const std::map<std::string, double> before = Scrape(cluster());
  auto grew = [&](const std::map<std::string, double>& after, const std::string& series) {
    auto now = after.find(series);
    EXPECT_NE(now, after.end()) << series << " is missing";
    if (now == after.end()) return -1.0;
    auto then = before.find(series);
    return now->second - (then == before.end() ? 0.0 : then->second);
  };

  // Two samples of 5 tokens each, and a request refused when submitted.
  const auto [status, reply] =
      Post(cluster(), "/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 5}, {"n", 2}, {"ignore_eos", true}});
  ASSERT_EQ(status, 200) << reply.dump();
  const int prompt_tokens = reply["usage"]["prompt_tokens"].get<int>();
  ASSERT_EQ(reply["usage"]["completion_tokens"], 10);
  const auto [refused, error] =
      Post(cluster(), "/v1/completions", {{"prompt", std::vector<int>(2000, 5)}, {"max_tokens", 1}});
  ASSERT_EQ(refused, 400);

  const std::map<std::string, double> after = Scrape(cluster());
  EXPECT_EQ(grew(after, R"(lamina_requests_total{status="OK"})"), 1);
  EXPECT_EQ(grew(after, R"(lamina_requests_total{status="INVALID_ARGUMENT"})"), 1);
  EXPECT_EQ(grew(after, R"(lamina_sequences_finished_total{reason="length"})"), 2);
  EXPECT_EQ(grew(after, "lamina_generation_tokens_total"), 10);
  EXPECT_EQ(grew(after, "lamina_prompt_tokens_total"), prompt_tokens);
  EXPECT_EQ(grew(after, "lamina_request_queue_time_seconds_count"), 1);
  EXPECT_EQ(grew(after, "lamina_time_to_first_token_seconds_count"), 1);
  // Each sample's tokens after its first: the second sample's first comes with the first's.
  EXPECT_EQ(grew(after, "lamina_inter_token_latency_seconds_count"), 8);
  EXPECT_EQ(grew(after, "lamina_request_latency_seconds_count"), 1);
  EXPECT_EQ(grew(after, "lamina_request_generation_tokens_sum"), 10);
  EXPECT_EQ(grew(after, "lamina_request_prompt_tokens_sum"), prompt_tokens);
  // The request's whole time holds its first token's and its tokens' gaps.
  EXPECT_GE(grew(after, "lamina_request_latency_seconds_sum"), grew(after, "lamina_time_to_first_token_seconds_sum"));
  EXPECT_GT(grew(after, "lamina_iterations_total"), 0);

  EXPECT_EQ(after.at(R"(lamina_info{model=")" + ModelName() + R"(",pipelining="none"})"), 1);
  EXPECT_EQ(after.at("lamina_requests_waiting"), 0);
  EXPECT_EQ(after.at("lamina_sequences_running"), 0);
  EXPECT_EQ(after.at(R"(lamina_node_up{node="compute-0",role="compute"})"), 1);
  for (const std::string node : {"memory-0", "memory-1"}) {
    EXPECT_EQ(after.at(R"(lamina_node_up{node=")" + node + R"(",role="memory"})"), 1);
    EXPECT_EQ(after.at(R"(lamina_kv_slots_capacity{node=")" + node + R"("})"), 8192);
    EXPECT_EQ(after.at(R"(lamina_kv_slots_used{node=")" + node + R"("})"), 0) << "a finished request keeps no slots";
    EXPECT_LT(after.at(R"(lamina_node_heartbeat_age_seconds{node=")" + node + R"("})"), 10);
  }
  // Round trips come with the compute node's heartbeats.
  const std::string round_trips = R"(lamina_node_round_trips_total{node="compute-0"})";
  double trips = after.at(round_trips);
  for (int i = 0; i < 100 && trips == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    trips = Scrape(cluster()).at(round_trips);
  }
  EXPECT_GT(trips, 0);

  absl::StatusOr<HttpReply> post = HttpCall(cluster().http_address(), "POST", "/metrics", "{}");
  ASSERT_TRUE(post.ok());
  EXPECT_EQ(post->status, 405);
}

// `lamina bench --openai` sends the same workload over OpenAI's HTTP API: with the cluster's gRPC
// endpoint its report has the cluster's figures too; alone (as for another server) the client's.
TEST_F(OpenAiClusterTest, BenchOverOpenAisApiCountsWhatTheGrpcApiCounts) {
  TempDir dir;
  const std::string workload = " --requests 6 --concurrency 3 --prompt-tokens 16 --output-tokens 8 --quiet --json ";
  const std::string url = " --openai http://" + cluster().http_address();
  auto bench = [&](const std::string& name, const std::string& server) {
    const std::string path = dir.path() + "/" + name + ".json";
    auto [code, out] = RunCli("bench" + server + workload + path);
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("tokens/s"), std::string::npos) << out;
    std::ifstream file(path);
    return json::parse(file, nullptr, /*allow_exceptions=*/false);
  };
  const json grpc = bench("grpc", " --endpoint " + cluster().endpoint());
  const json http = bench("http", " --endpoint " + cluster().endpoint() + url);
  const json alone = bench("alone", url + " --vocab-size 1000");
  for (const json* report : {&grpc, &http, &alone}) {
    ASSERT_TRUE(report->is_object());
    EXPECT_EQ((*report)["requests"], 6) << report->dump();
    EXPECT_EQ((*report)["failed"], 0) << report->dump();
    EXPECT_EQ((*report)["input_tokens"], 96) << "the server's count of 6 prompts of 16 ids";
    EXPECT_EQ((*report)["output_tokens"], 48);
    EXPECT_GT((*report)["ttft_ms"]["p50"].get<double>(), 0);
  }
  EXPECT_EQ(http["nodes"].size(), grpc["nodes"].size()) << "the cluster's figures come over gRPC";
  EXPECT_EQ(grpc["nodes"].size(), 3u);
  EXPECT_TRUE(alone["nodes"].empty());

  auto [code, out] = RunCli("bench" + url + " --requests 1 --quiet");
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("--vocab-size"), std::string::npos) << out;
  std::tie(code, out) = RunCli("bench --openai http://example.com --vocab-size 10");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("is not an OpenAI-compatible server's address"), std::string::npos) << out;
  // https to a server that speaks plain HTTP: the handshake fails, naming the server.
  std::tie(code, out) = RunCli("bench --openai https://" + cluster().http_address() + " --requests 1 --quiet");
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find(cluster().http_address()), std::string::npos) << out;
}

}  // namespace
}  // namespace lamina::testing
