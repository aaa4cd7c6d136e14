#include "coordinator/api/generation_request.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chat_template/chat_prompt.h"
#include "common/status/status_macros.h"
#include "compute_node/sampling/sampling_proto.h"

namespace lamina {

absl::Status CheckRequestBounds(const lamina::v1::GenerateRequest& request, const ModelConfig& config) {
  const int64_t most_bytes = std::max(kMinPromptBytes, kMaxPromptBytesPerToken * config.max_position_embeddings);
  if (request.has_token_ids() && request.token_ids().ids_size() > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", request.token_ids().ids_size(),
                                                   " tokens; the model's context is ", config.max_position_embeddings,
                                                   " tokens"));
  }
  if (request.has_chat()) {
    if (request.chat().messages_size() > kMaxMessages) {
      return absl::InvalidArgumentError(absl::StrCat("chat.messages: ", request.chat().messages_size(),
                                                     " messages; at most ", kMaxMessages));
    }
    int64_t bytes = 0;
    for (const lamina::v1::ChatMessage& m : request.chat().messages()) bytes += m.content().size() + m.role().size();
    if (bytes > most_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat.messages: ", bytes, " bytes; at most ", most_bytes, " for this model's context"));
    }
  }
  if (static_cast<int64_t>(request.text().size()) > most_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("text: ", request.text().size(), " bytes; at most ", most_bytes,
                                                   " for this model's context of ", config.max_position_embeddings,
                                                   " tokens"));
  }
  if (request.sampling().min_tokens() < 0 ||
      (request.max_tokens() > 0 && request.sampling().min_tokens() > request.max_tokens())) {
    return absl::InvalidArgumentError(absl::StrCat("min_tokens: must be from 0 to max_tokens (", request.max_tokens(),
                                                   "), got ", request.sampling().min_tokens()));
  }
  if (request.n() < 0 || request.n() > kMaxSamples) {
    return absl::InvalidArgumentError(absl::StrCat("n: must be from 1 to ", kMaxSamples, ", got ", request.n()));
  }
  if (request.stop_strings_size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(absl::StrCat("stop_strings: ", request.stop_strings_size(),
                                                   " strings; at most ", kMaxStopStrings));
  }
  for (const std::string& stop : request.stop_strings()) {
    if (static_cast<int64_t>(stop.size()) > kMaxStopBytes) {
      return absl::InvalidArgumentError(absl::StrCat("stop_strings: a string of ", stop.size(), " bytes; at most ",
                                                     kMaxStopBytes));
    }
  }
  if (request.stop_token_ids_size() > kMaxStopIds) {
    return absl::InvalidArgumentError(absl::StrCat("stop_token_ids: ", request.stop_token_ids_size(),
                                                   " ids; at most ", kMaxStopIds));
  }
  for (int32_t id : request.stop_token_ids()) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("stop_token_ids: ", id, " is outside the vocabulary (0..",
                                                     config.vocab_size - 1, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GenerationSpec> ToGenerationSpec(const lamina::v1::GenerateRequest& request, const Tokenizer& tokenizer,
                                                const absl::StatusOr<ChatTemplate>& chat_template,
                                                const ModelConfig& config) {
  LAMINA_RETURN_IF_ERROR(CheckRequestBounds(request, config));
  GenerationSpec spec;
  if (request.has_token_ids()) {
    spec.prompt.assign(request.token_ids().ids().begin(), request.token_ids().ids().end());
  } else if (request.has_chat()) {
    std::vector<ChatMessage> messages;
    for (const lamina::v1::ChatMessage& m : request.chat().messages()) messages.push_back({m.role(), m.content()});
    absl::StatusOr<std::vector<int32_t>> prompt = EncodeChat(chat_template, tokenizer, messages);
    if (!prompt.ok()) return prompt.status();
    spec.prompt = *std::move(prompt);
  } else {
    spec.prompt = tokenizer.EncodePrompt(request.text());
  }
  spec.sampling = SamplingFromProto(request.sampling());
  spec.n = request.n() > 0 ? request.n() : 1;
  spec.stop.max_tokens = request.max_tokens();
  spec.stop.ignore_eos = request.ignore_eos();
  spec.stop.stop_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  spec.stop_strings.assign(request.stop_strings().begin(), request.stop_strings().end());
  // min_tokens holds back what would end the sequence: end of sequence (unless ignored) and stop ids.
  spec.stop.min_tokens = spec.sampling.min_tokens;
  spec.sampling.min_tokens_stop_ids.clear();
  if (spec.sampling.min_tokens > 0) {
    if (!spec.stop.ignore_eos) {
      for (int64_t id : config.eos_token_ids) spec.sampling.min_tokens_stop_ids.push_back(static_cast<int32_t>(id));
    }
    for (int32_t id : spec.stop.stop_ids) spec.sampling.min_tokens_stop_ids.push_back(id);
  }
  return spec;
}

lamina::v1::TokenLogprobs WithTokenTexts(int32_t token, const lamina::v1::TokenLogprobs& logprobs,
                                         const Tokenizer& tokenizer) {
  lamina::v1::TokenLogprobs out = logprobs;
  out.set_token(tokenizer.TokenText(token));
  for (lamina::v1::TokenLogprob& top : *out.mutable_top()) top.set_token(tokenizer.TokenText(top.token_id()));
  return out;
}

}  // namespace lamina
