// The bodies of OpenAI's POST /v1/completions and /v1/chat/completions, parsed into Lamina's own
// GenerateRequest (one per prompt), so that the HTTP API means exactly what the gRPC API means.
//
// Taken: model, prompt (a string, strings, token ids, or lists of token ids) or messages (roles
// with string content or text parts), max_tokens (chat: also max_completion_tokens), temperature,
// top_p, n, stop, seed, presence_penalty, frequency_penalty, stream, stream_options.include_usage,
// logprobs (completions: a count; chat: a flag, with top_logprobs), user (ignored), and vLLM's
// extensions top_k, min_p, repetition_penalty, ignore_eos and stop_token_ids.
// Refused with a message naming the field: what Lamina cannot honour (echo, suffix, best_of other
// than n, logit_bias, tools and functions, a response_format other than text, non-text content),
// unknown fields (a misspelt field is never silently ignored), and values of the wrong type.
#ifndef LAMINA_COORDINATOR_OPENAI_OPENAI_REQUEST_H_
#define LAMINA_COORDINATOR_OPENAI_OPENAI_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lamina/v1/generation.pb.h"

namespace lamina {

enum class OpenAiEndpoint { kCompletions, kChatCompletions };

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string model;  // empty when the body names none
  // One request per prompt (chat: one), sampling and stop settings filled in. max_tokens is 0
  // when a chat gave none: the rest of the model's context.
  std::vector<lamina::v1::GenerateRequest> prompts;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
};

// The deepest nesting of arrays and objects a body may have (a chat's content parts need 5).
inline constexpr int kMaxJsonDepth = 32;

// Parses `body` for `endpoint`. `seed` is used when the body gives none (OpenAI's requests are
// random unless seeded). InvalidArgument says what is wrong; ErrorParam names the field. Bodies
// nested deeper than kMaxJsonDepth are refused before they are parsed.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, absl::string_view body, uint64_t seed);

// The request field an error from ParseOpenAiRequest is about (e.g. "messages[1].content"), or
// empty when it is about no one field.
std::string ErrorParam(const absl::Status& status);
// `status` marked as being about `field`, for ErrorParam.
absl::Status AboutField(absl::Status status, const std::string& field);

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_OPENAI_OPENAI_REQUEST_H_
