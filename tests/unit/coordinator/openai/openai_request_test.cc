#include "coordinator/openai/openai_request.h"

#include "gtest/gtest.h"

namespace lamina {
namespace {

absl::StatusOr<OpenAiRequest> Completions(absl::string_view body) {
  return ParseOpenAiRequest(OpenAiEndpoint::kCompletions, body, /*seed=*/77);
}
absl::StatusOr<OpenAiRequest> Chat(absl::string_view body) {
  return ParseOpenAiRequest(OpenAiEndpoint::kChatCompletions, body, /*seed=*/77);
}

TEST(OpenAiRequestTest, CompletionsTakeOpenAisDefaults) {
  absl::StatusOr<OpenAiRequest> r = Completions(R"({"model": "m", "prompt": "Hello"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "m");
  EXPECT_FALSE(r->stream);
  ASSERT_EQ(r->prompts.size(), 1u);
  const lamina::v1::GenerateRequest& p = r->prompts[0];
  EXPECT_EQ(p.text(), "Hello");
  EXPECT_EQ(p.max_tokens(), 16);
  EXPECT_EQ(p.n(), 1);
  EXPECT_FLOAT_EQ(p.sampling().temperature(), 1.0f);
  EXPECT_EQ(p.sampling().seed(), 77u);  // unseeded: the caller's random seed
  EXPECT_FALSE(p.sampling().logprobs());
  EXPECT_EQ(p.stop_strings_size(), 0);
}

TEST(OpenAiRequestTest, CompletionsTakeEverySettingTheyName) {
  absl::StatusOr<OpenAiRequest> r = Completions(R"({
      "prompt": "Hi", "max_tokens": 5, "temperature": 0, "top_p": 0.5, "n": 3, "best_of": 3, "seed": 9,
      "stop": ["\n", "END"], "presence_penalty": 0.5, "frequency_penalty": -0.25, "logprobs": 2,
      "echo": false, "suffix": null, "stream": true, "stream_options": {"include_usage": true},
      "user": "u", "logit_bias": {}, "top_k": 4, "min_p": 0.1, "repetition_penalty": 1.2,
      "ignore_eos": true, "stop_token_ids": [7, 8], "store": false, "metadata": {"team": "a"},
      "service_tier": "auto", "min_tokens": 3})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  const lamina::v1::GenerateRequest& p = r->prompts[0];
  EXPECT_EQ(p.max_tokens(), 5);
  EXPECT_EQ(p.n(), 3);
  EXPECT_FLOAT_EQ(p.sampling().temperature(), 0.0f);
  EXPECT_FLOAT_EQ(p.sampling().top_p(), 0.5f);
  EXPECT_EQ(p.sampling().seed(), 9u);
  EXPECT_EQ(p.sampling().top_k(), 4);
  EXPECT_FLOAT_EQ(p.sampling().min_p(), 0.1f);
  EXPECT_FLOAT_EQ(p.sampling().repetition_penalty(), 1.2f);
  EXPECT_FLOAT_EQ(p.sampling().presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(p.sampling().frequency_penalty(), -0.25f);
  EXPECT_TRUE(p.sampling().logprobs());
  EXPECT_EQ(p.sampling().top_logprobs(), 2);
  ASSERT_EQ(p.stop_strings_size(), 2);
  EXPECT_EQ(p.stop_strings(1), "END");
  ASSERT_EQ(p.stop_token_ids_size(), 2);
  EXPECT_EQ(p.stop_token_ids(0), 7);
  EXPECT_TRUE(p.ignore_eos());
  EXPECT_EQ(p.sampling().min_tokens(), 3);
}

TEST(OpenAiRequestTest, APromptMayBeTextsOrTokenIds) {
  absl::StatusOr<OpenAiRequest> ids = Completions(R"({"prompt": [1, 2, 3], "max_tokens": 2})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->prompts.size(), 1u);
  EXPECT_EQ(ids->prompts[0].token_ids().ids_size(), 3);
  EXPECT_EQ(ids->prompts[0].max_tokens(), 2);

  absl::StatusOr<OpenAiRequest> many = Completions(R"({"prompt": ["a", [5, 6], "b"], "n": 2})");
  ASSERT_TRUE(many.ok()) << many.status();
  ASSERT_EQ(many->prompts.size(), 3u);
  EXPECT_EQ(many->prompts[0].text(), "a");
  EXPECT_EQ(many->prompts[1].token_ids().ids(1), 6);
  EXPECT_EQ(many->prompts[2].text(), "b");
  for (const lamina::v1::GenerateRequest& p : many->prompts) EXPECT_EQ(p.n(), 2);  // settings on each
}

TEST(OpenAiRequestTest, ChatsTakeMessagesWithStringsOrTextParts) {
  absl::StatusOr<OpenAiRequest> r = Chat(R"({"model": "m", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "name": "ada", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null},
      {"role": "user", "content": "Why?"}],
      "max_completion_tokens": 7, "logprobs": true, "top_logprobs": 3, "tool_choice": "none",
      "response_format": {"type": "text"}})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->prompts.size(), 1u);
  const lamina::v1::Chat& chat = r->prompts[0].chat();
  ASSERT_EQ(chat.messages_size(), 4);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(1).content(), "Hi there");
  EXPECT_EQ(chat.messages(2).content(), "");
  EXPECT_EQ(r->prompts[0].max_tokens(), 7);
  EXPECT_TRUE(r->prompts[0].sampling().logprobs());
  EXPECT_EQ(r->prompts[0].sampling().top_logprobs(), 3);

  absl::StatusOr<OpenAiRequest> no_limit = Chat(R"({"messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(no_limit.ok());
  EXPECT_EQ(no_limit->prompts[0].max_tokens(), 0);  // the rest of the context, once tokenized
}

// The message, and the field ErrorParam names, of a refused body.
std::pair<std::string, std::string> Refusal(const absl::StatusOr<OpenAiRequest>& r) {
  if (r.ok()) return {"accepted", ""};
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  return {std::string(r.status().message()), ErrorParam(r.status())};
}

TEST(OpenAiRequestTest, BadBodiesAreRefusedNamingTheField) {
  using Pair = std::pair<std::string, std::string>;
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "temprature": 0})")),
            Pair("'temprature': unknown field", "temprature"));
  EXPECT_EQ(Refusal(Completions(R"({"temperature": 0})")), Pair("'prompt': missing", "prompt"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "temperature": "hot"})")),
            Pair("'temperature': expected a number, got \"hot\"", "temperature"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "max_tokens": 0})")),
            Pair("'max_tokens': expected an integer from 1 to 2147483647, got 0", "max_tokens"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "n": 2.5})")), Pair("'n': expected an integer, got 2.5", "n"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "top_p": 0})")),
            Pair("'top_p': top_p must be in (0, 1], got 0", "top_p"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "presence_penalty": 3})")),
            Pair("'presence_penalty': presence_penalty must be from -2 to 2, got 3", "presence_penalty"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "logprobs": 21})")),
            Pair("'logprobs': expected an integer from 0 to 20, got 21", "logprobs"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": []})")),
            Pair("'prompt': expected a string, strings, token ids or lists of token ids, got []", "prompt"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": ["a", 5]})")),
            Pair("'prompt[1]': expected a string or a list of token ids, got 5", "prompt[1]"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": [1, -2]})")), Pair("'prompt': token id -2 is out of range", "prompt"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "stop": ["a", 1]})")),
            Pair("'stop': expected strings, got 1", "stop"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "stop": ""})")), Pair("'stop': a stop string is empty", "stop"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "echo": true})")), Pair("'echo': not supported", "echo"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "user": 5})")), Pair("'user': expected a string, got 5", "user"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "n": 2, "best_of": 3})")),
            Pair("'best_of': not supported (other than equal to n)", "best_of"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "logit_bias": {"5": 100}})")),
            Pair("'logit_bias': not supported", "logit_bias"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "stream_options": {"include_usage": true}})")),
            Pair("'stream_options': only allowed with 'stream': true", "stream_options"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "messages": []})")), Pair("'messages': unknown field", "messages"));

  EXPECT_EQ(Refusal(Chat(R"({"messages": []})")), Pair("'messages': expected a list of messages, got []", "messages"));
  EXPECT_EQ(Refusal(Chat(R"({"messages": [{"content": "x"}]})")),
            Pair("'messages[0].role': missing", "messages[0].role"));
  EXPECT_EQ(Refusal(Chat(R"({"messages": [{"role": "user", "content": "x", "name": 5}]})")),
            Pair("'messages[0].name': expected a string, got 5", "messages[0].name"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "max_tokens": 5, "min_tokens": 20})")),
            Pair("'min_tokens': must be at most max_tokens (5), got 20", "min_tokens"));
  EXPECT_EQ(Refusal(Completions(R"({"prompt": "x", "metadata": [1]})")),
            Pair("'metadata': expected an object, got [1]", "metadata"));
  EXPECT_EQ(Refusal(Chat(R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})")),
            Pair("'messages[0].content[0].type': 'image_url' is not supported: this model takes text only",
                 "messages[0].content[0].type"));
  EXPECT_EQ(Refusal(Chat(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})")),
            Pair("'top_logprobs': needs 'logprobs': true", "top_logprobs"));
  EXPECT_EQ(Refusal(Chat(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})")),
            Pair("'tools': not supported: Lamina does not call tools", "tools"));
  EXPECT_EQ(Refusal(Chat(R"({"messages": [{"role": "user", "content": "x"}], "prompt": "y"})")),
            Pair("'prompt': unknown field", "prompt"));
}

TEST(OpenAiRequestTest, ABodyThatIsNotJsonSaysWhere) {
  absl::StatusOr<OpenAiRequest> r = Completions("{\"prompt\": \"x\",\n \"n\": }");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(std::string(r.status().message()),
            "the body is not valid JSON: parse error at line 2, column 7: syntax error while parsing value - "
            "unexpected '}'; expected '[', '{', or a literal");
  EXPECT_EQ(ErrorParam(r.status()), "");
  EXPECT_EQ(Completions("[1]").status().message(), "the body is not a JSON object");
  // Found by openai_body_fuzzer: nlohmann::json throws out_of_range, not parse_error, for this.
  EXPECT_EQ(std::string(Completions(R"({"prompt": "x", "n": 1E3906})").status().message()),
            "the body is not valid JSON: number overflow parsing '1E3906'");
}

}  // namespace
}  // namespace lamina
