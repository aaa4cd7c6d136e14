// The JSON that OpenAI's API answers with, built from what the scheduler's events carry:
// completion and chat.completion bodies, their streamed chunks (server-sent events), usage,
// log probabilities in each endpoint's shape, the model list, and errors.
#ifndef LAMINA_COORDINATOR_OPENAI_OPENAI_OUTPUT_H_
#define LAMINA_COORDINATOR_OPENAI_OPENAI_OUTPUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "coordinator/openai/openai_request.h"
#include "coordinator/sequence/stop_conditions.h"
#include "lamina/v1/generation.pb.h"
#include "nlohmann/json.hpp"

namespace lamina {

// What every body and chunk of one response repeats.
struct OpenAiResponseHeader {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// A choice's text and tokens: all of it (a whole body) or what one event added (a chunk).
struct ChoiceOutput {
  int index = 0;
  std::string text;
  // One per token, with token texts (WithTokenTexts), when the request asked for them.
  std::vector<lamina::v1::TokenLogprobs> logprobs;
  bool want_logprobs = false;
  // Completions' text_offset of the first token: characters of the choice's text before it.
  int64_t text_offset = 0;
  FinishReason finish = FinishReason::kNone;
};

struct OpenAiUsage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// "stop" (end of sequence, a stop string or stop token), "length" (max_tokens, the context
// full), or null while the choice goes on.
nlohmann::ordered_json FinishReasonJson(FinishReason reason);

// The body of a whole (not streamed) response.
nlohmann::ordered_json ResponseBody(const OpenAiResponseHeader& header, const std::vector<ChoiceOutput>& choices,
                                    const OpenAiUsage& usage);
// A streamed chunk with one choice's delta. `opening`: the chat chunk that gives the role.
nlohmann::ordered_json ChunkBody(const OpenAiResponseHeader& header, const ChoiceOutput& delta, bool opening = false);
// The last streamed chunk when stream_options.include_usage asked: no choices, the usage.
nlohmann::ordered_json UsageChunkBody(const OpenAiResponseHeader& header, const OpenAiUsage& usage);
// One server-sent event: "data: <json>\n\n".
std::string ServerSentEvent(const nlohmann::ordered_json& body);
inline constexpr absl::string_view kDoneEvent = "data: [DONE]\n\n";

// Characters (Unicode code points) in UTF-8 `text`, as completions' text_offset counts them.
int64_t CharacterCount(absl::string_view text);

// The model list (GET /v1/models) and one model (GET /v1/models/{id}).
nlohmann::ordered_json ModelJson(const std::string& name, int64_t created, int64_t max_context);
nlohmann::ordered_json ModelListJson(const std::string& name, int64_t created, int64_t max_context);

// An error as OpenAI gives it: {"error": {"message", "type", "param", "code"}}, and its HTTP
// status: 400 for a bad request (a field, a refused chat, a prompt too long for the context or
// the cluster), 404 for an unknown model or path, 503 when the cluster cannot serve, 504 past a
// deadline, 500 otherwise.
int HttpStatusOf(const absl::Status& status);
nlohmann::ordered_json ErrorJson(const absl::Status& status, const std::string& param = "",
                                 const std::string& code = "");

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_OPENAI_OPENAI_OUTPUT_H_
