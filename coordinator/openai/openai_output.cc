#include "coordinator/openai/openai_output.h"

#include "absl/strings/str_cat.h"

namespace lamina {
namespace {

using json = nlohmann::ordered_json;

bool IsChat(const OpenAiResponseHeader& header) { return header.endpoint == OpenAiEndpoint::kChatCompletions; }

json Bytes(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

// Completions' shape: parallel lists of tokens, their log probabilities, the top tokens of each
// step as {token: logprob}, and each token's offset in the choice's text.
json CompletionLogprobs(const ChoiceOutput& choice) {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  int64_t offset = choice.text_offset;
  for (const lamina::v1::TokenLogprobs& token : choice.logprobs) {
    tokens.push_back(token.token());
    token_logprobs.push_back(token.logprob());
    json top = json::object();
    for (const lamina::v1::TokenLogprob& t : token.top()) top[t.token()] = t.logprob();
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(offset);
    offset += CharacterCount(token.token());
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top_logprobs},
          {"text_offset", text_offset}};
}

// Chat's shape: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
json ChatLogprobs(const ChoiceOutput& choice) {
  json content = json::array();
  for (const lamina::v1::TokenLogprobs& token : choice.logprobs) {
    json top = json::array();
    for (const lamina::v1::TokenLogprob& t : token.top()) {
      top.push_back({{"token", t.token()}, {"logprob", t.logprob()}, {"bytes", Bytes(t.token())}});
    }
    content.push_back({{"token", token.token()},
                       {"logprob", token.logprob()},
                       {"bytes", Bytes(token.token())},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json LogprobsJson(const OpenAiResponseHeader& header, const ChoiceOutput& choice) {
  if (!choice.want_logprobs) return nullptr;
  return IsChat(header) ? ChatLogprobs(choice) : CompletionLogprobs(choice);
}

json UsageJson(const OpenAiUsage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json Envelope(const OpenAiResponseHeader& header, absl::string_view object) {
  return {{"id", header.id}, {"object", object}, {"created", header.created}, {"model", header.model}};
}

}  // namespace

json FinishReasonJson(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEndOfSequence:
    case FinishReason::kStopId:
    case FinishReason::kStopString:
      return "stop";
    case FinishReason::kMaxTokens:
    case FinishReason::kContextFull:
      return "length";
    case FinishReason::kNone:
      break;
  }
  return nullptr;
}

json ResponseBody(const OpenAiResponseHeader& header, const std::vector<ChoiceOutput>& choices,
                  const OpenAiUsage& usage) {
  json body = Envelope(header, IsChat(header) ? "chat.completion" : "text_completion");
  json list = json::array();
  for (const ChoiceOutput& choice : choices) {
    json c = {{"index", choice.index}};
    if (IsChat(header)) {
      c["message"] = {{"role", "assistant"}, {"content", choice.text}};
    } else {
      c["text"] = choice.text;
    }
    c["logprobs"] = LogprobsJson(header, choice);
    c["finish_reason"] = FinishReasonJson(choice.finish);
    list.push_back(std::move(c));
  }
  body["choices"] = std::move(list);
  body["usage"] = UsageJson(usage);
  return body;
}

json ChunkBody(const OpenAiResponseHeader& header, const ChoiceOutput& delta, bool opening) {
  json body = Envelope(header, IsChat(header) ? "chat.completion.chunk" : "text_completion");
  json c = {{"index", delta.index}};
  if (IsChat(header)) {
    json d = json::object();
    if (opening) d["role"] = "assistant";
    if (opening || !delta.text.empty()) d["content"] = delta.text;
    c["delta"] = std::move(d);
  } else {
    c["text"] = delta.text;
  }
  c["logprobs"] = opening ? json(nullptr) : LogprobsJson(header, delta);
  c["finish_reason"] = FinishReasonJson(delta.finish);
  body["choices"] = json::array({std::move(c)});
  return body;
}

json UsageChunkBody(const OpenAiResponseHeader& header, const OpenAiUsage& usage) {
  json body = Envelope(header, IsChat(header) ? "chat.completion.chunk" : "text_completion");
  body["choices"] = json::array();
  body["usage"] = UsageJson(usage);
  return body;
}

std::string ServerSentEvent(const json& body) {
  return absl::StrCat("data: ", body.dump(-1, ' ', false, json::error_handler_t::replace), "\n\n");
}

int64_t CharacterCount(absl::string_view text) {
  int64_t count = 0;
  for (char c : text) count += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return count;
}

json ModelJson(const std::string& name, int64_t created, int64_t max_context) {
  return {
      {"id", name}, {"object", "model"}, {"created", created}, {"owned_by", "lamina"}, {"max_model_len", max_context}};
}

json ModelListJson(const std::string& name, int64_t created, int64_t max_context) {
  return {{"object", "list"}, {"data", json::array({ModelJson(name, created, max_context)})}};
}

int HttpStatusOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kResourceExhausted:  // the scheduler's: a request that can never fit
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kCancelled:
      return 499;
    default:
      return 500;
  }
}

json ErrorJson(const absl::Status& status, const std::string& param, const std::string& code) {
  const int http = HttpStatusOf(status);
  json error = {{"message", std::string(status.message())},
                {"type", http < 500 ? "invalid_request_error" : "server_error"},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}};
  return {{"error", std::move(error)}};
}

}  // namespace lamina
