// What the client APIs (gRPC's Generation service and the OpenAI-compatible HTTP API) share: a
// GenerateRequest turned into what the scheduler takes, and the compute node's log probabilities
// given their tokens' text. Both APIs go through here, so a request means the same on either.
#ifndef LAMINA_COORDINATOR_API_GENERATION_REQUEST_H_
#define LAMINA_COORDINATOR_API_GENERATION_REQUEST_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/chat_template/chat_template.h"
#include "common/model_config/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/scheduler/request.h"
#include "lamina/v1/generation.pb.h"

namespace lamina {

// What a request may hold, checked before anything is tokenized (a prompt's bytes bound the work
// of tokenizing it): its text, or its chat's messages together, up to kMaxPromptBytesPerToken
// bytes a token of the model's context (at least kMinPromptBytes); no more token ids than the
// context; at most kMaxMessages messages, kMaxStopStrings stop strings of kMaxStopBytes and
// kMaxStopIds stop ids (within the vocabulary); `n` from 0 (meaning 1) to kMaxSamples.
inline constexpr int64_t kMaxPromptBytesPerToken = 16;
inline constexpr int64_t kMinPromptBytes = 1 << 16;
inline constexpr int kMaxMessages = 1024;
inline constexpr int kMaxStopStrings = 16;
inline constexpr int64_t kMaxStopBytes = 1024;
inline constexpr int kMaxStopIds = 256;
inline constexpr int kMaxSamples = 64;

// InvalidArgument naming the field when `request` breaks one of the bounds above.
absl::Status CheckRequestBounds(const lamina::v1::GenerateRequest& request, const ModelConfig& config);

// The prompt tokenized (text with the model's BOS, token ids as given, a chat through
// `chat_template` with no second BOS) and the sampling and stop settings copied, once
// CheckRequestBounds passes. Fails with the chat template's error for a chat it refuses, or with
// its load error when the model has none. The scheduler validates the rest when the spec is
// submitted.
absl::StatusOr<GenerationSpec> ToGenerationSpec(const lamina::v1::GenerateRequest& request, const Tokenizer& tokenizer,
                                                const absl::StatusOr<ChatTemplate>& chat_template,
                                                const ModelConfig& config);

// `logprobs` of `token` as the compute node sent them, with the text of each token filled in.
lamina::v1::TokenLogprobs WithTokenTexts(int32_t token, const lamina::v1::TokenLogprobs& logprobs,
                                         const Tokenizer& tokenizer);

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_API_GENERATION_REQUEST_H_
