// A conversation's prompt ids: what the coordinator and `lamina generate --chat` feed the model.
// Thread-safe.
#ifndef LAMINA_COMMON_CHAT_TEMPLATE_CHAT_PROMPT_H_
#define LAMINA_COMMON_CHAT_TEMPLATE_CHAT_PROMPT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat_template/chat_template.h"
#include "common/tokenizer/tokenizer.h"

namespace lamina {

// Renders `messages` with the assistant's turn opened and encodes the text with no BOS added (the
// template writes its own special tokens, as apply_chat_template does). `chat_template` is what
// ChatTemplate::Load gave: when it failed, FailedPrecondition says the model takes no chats and
// why. InvalidArgument for no messages, or a conversation the template refuses.
absl::StatusOr<std::vector<int32_t>> EncodeChat(const absl::StatusOr<ChatTemplate>& chat_template,
                                                const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages);

}  // namespace lamina

#endif  // LAMINA_COMMON_CHAT_TEMPLATE_CHAT_PROMPT_H_
