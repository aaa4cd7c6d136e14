#include "common/chat_template/chat_prompt.h"

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

namespace lamina {

absl::StatusOr<std::vector<int32_t>> EncodeChat(const absl::StatusOr<ChatTemplate>& chat_template,
                                                const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages) {
  if (!chat_template.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("this model takes no chat: ", chat_template.status().message()));
  }
  if (messages.empty()) return absl::InvalidArgumentError("a chat needs at least one message");
  LAMINA_ASSIGN_OR_RETURN(std::string text, chat_template->Apply(messages, /*add_generation_prompt=*/true));
  return tokenizer.Encode(text);
}

}  // namespace lamina
