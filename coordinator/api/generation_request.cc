#include "coordinator/api/generation_request.h"

#include <utility>
#include <vector>

#include "common/chat_template/chat_prompt.h"
#include "compute_node/sampling/sampling_proto.h"

namespace lamina {

absl::StatusOr<GenerationSpec> ToGenerationSpec(const lamina::v1::GenerateRequest& request, const Tokenizer& tokenizer,
                                                const absl::StatusOr<ChatTemplate>& chat_template) {
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
