#include "coordinator/openai/openai_output.h"

#include "gtest/gtest.h"

namespace lamina {
namespace {

using json = nlohmann::ordered_json;

OpenAiResponseHeader Header(OpenAiEndpoint endpoint) { return {endpoint, "id-1", 1700000000, "demo"}; }

lamina::v1::TokenLogprobs Token(const std::string& text, float logprob,
                                std::vector<std::pair<std::string, float>> top) {
  lamina::v1::TokenLogprobs token;
  token.set_token(text);
  token.set_logprob(logprob);
  for (const auto& [t, lp] : top) {
    lamina::v1::TokenLogprob* entry = token.add_top();
    entry->set_token(t);
    entry->set_logprob(lp);
  }
  return token;
}

TEST(OpenAiOutputTest, AWholeCompletionBody) {
  ChoiceOutput choice;
  choice.index = 0;
  choice.text = " héllo";
  choice.finish = FinishReason::kMaxTokens;
  choice.want_logprobs = true;
  choice.logprobs = {Token(" hé", -0.5f, {{" hé", -0.5f}, {" a", -1.5f}}), Token("llo", -0.25f, {})};
  const json body = ResponseBody(Header(OpenAiEndpoint::kCompletions), {choice}, {8, 2});
  EXPECT_EQ(body.dump(),
            R"({"id":"id-1","object":"text_completion","created":1700000000,"model":"demo","choices":[{"index":0,)"
            R"("text":" héllo","logprobs":{"tokens":[" hé","llo"],"token_logprobs":[-0.5,-0.25],)"
            R"("top_logprobs":[{" hé":-0.5," a":-1.5},{}],"text_offset":[0,3]},"finish_reason":"length"}],)"
            R"("usage":{"prompt_tokens":8,"completion_tokens":2,"total_tokens":10}})");
}

TEST(OpenAiOutputTest, AWholeChatBodyAndItsLogprobs) {
  ChoiceOutput choice;
  choice.index = 1;
  choice.text = "Hi";
  choice.finish = FinishReason::kEndOfSequence;
  choice.want_logprobs = true;
  choice.logprobs = {Token("Hi", -0.125f, {{"Hi", -0.125f}})};
  const json body = ResponseBody(Header(OpenAiEndpoint::kChatCompletions), {choice}, {3, 1});
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0].dump(),
            R"({"index":1,"message":{"role":"assistant","content":"Hi"},"logprobs":{"content":[{"token":"Hi",)"
            R"("logprob":-0.125,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.125,"bytes":[72,105]}]}]},)"
            R"("finish_reason":"stop"})");
}

TEST(OpenAiOutputTest, StreamedChunks) {
  ChoiceOutput delta;
  delta.index = 2;
  delta.text = "ab";
  const json completion = ChunkBody(Header(OpenAiEndpoint::kCompletions), delta);
  EXPECT_EQ(completion["object"], "text_completion");
  EXPECT_EQ(completion["choices"].dump(), R"([{"index":2,"text":"ab","logprobs":null,"finish_reason":null}])");

  const OpenAiResponseHeader chat = Header(OpenAiEndpoint::kChatCompletions);
  ChoiceOutput opening;
  opening.index = 0;
  EXPECT_EQ(ChunkBody(chat, opening, /*opening=*/true)["choices"].dump(),
            R"([{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}])");
  EXPECT_EQ(ChunkBody(chat, delta)["choices"][0]["delta"].dump(), R"({"content":"ab"})");
  ChoiceOutput last;
  last.finish = FinishReason::kStopString;
  EXPECT_EQ(ChunkBody(chat, last)["choices"].dump(),
            R"([{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}])");
  EXPECT_EQ(ChunkBody(chat, last)["object"], "chat.completion.chunk");

  EXPECT_EQ(UsageChunkBody(chat, {4, 5}).dump(),
            R"({"id":"id-1","object":"chat.completion.chunk","created":1700000000,"model":"demo","choices":[],)"
            R"("usage":{"prompt_tokens":4,"completion_tokens":5,"total_tokens":9}})");
  EXPECT_EQ(ServerSentEvent(json{{"a", 1}}), "data: {\"a\":1}\n\n");
}

TEST(OpenAiOutputTest, FinishReasonsAndCharacters) {
  EXPECT_EQ(FinishReasonJson(FinishReason::kEndOfSequence), "stop");
  EXPECT_EQ(FinishReasonJson(FinishReason::kStopId), "stop");
  EXPECT_EQ(FinishReasonJson(FinishReason::kStopString), "stop");
  EXPECT_EQ(FinishReasonJson(FinishReason::kMaxTokens), "length");
  EXPECT_EQ(FinishReasonJson(FinishReason::kContextFull), "length");
  EXPECT_TRUE(FinishReasonJson(FinishReason::kNone).is_null());
  EXPECT_EQ(CharacterCount("héllo €"), 7);
}

TEST(OpenAiOutputTest, ErrorsAndTheirHttpStatus) {
  EXPECT_EQ(ErrorJson(absl::InvalidArgumentError("'n': bad"), "n").dump(),
            R"({"error":{"message":"'n': bad","type":"invalid_request_error","param":"n","code":null}})");
  EXPECT_EQ(ErrorJson(absl::NotFoundError("no model"), "model", "model_not_found")["error"]["code"], "model_not_found");
  EXPECT_EQ(ErrorJson(absl::UnavailableError("dead"))["error"]["type"], "server_error");
  EXPECT_EQ(HttpStatusOf(absl::InvalidArgumentError("")), 400);
  EXPECT_EQ(HttpStatusOf(absl::FailedPreconditionError("")), 400);
  EXPECT_EQ(HttpStatusOf(absl::ResourceExhaustedError("")), 400);
  EXPECT_EQ(HttpStatusOf(absl::NotFoundError("")), 404);
  EXPECT_EQ(HttpStatusOf(absl::UnavailableError("")), 503);
  EXPECT_EQ(HttpStatusOf(absl::DeadlineExceededError("")), 504);
  EXPECT_EQ(HttpStatusOf(absl::InternalError("")), 500);
}

TEST(OpenAiOutputTest, TheModelList) {
  EXPECT_EQ(ModelListJson("demo", 5, 1024).dump(),
            R"({"object":"list","data":[{"id":"demo","object":"model","created":5,"owned_by":"lamina",)"
            R"("max_model_len":1024}]})");
}

}  // namespace
}  // namespace lamina
