// A model's chat template: the Jinja program, shipped with a Hugging Face checkpoint, that turns a
// conversation into the prompt text the model was tuned on. Rendered as transformers'
// apply_chat_template renders it (trim_blocks, lstrip_blocks, raise_exception, tojson without key
// sorting, strftime_now), with the tokenizer's special tokens (bos_token, eos_token, ...) and
// add_generation_prompt. The text carries the template's own special tokens: tokenize it with
// Tokenizer::Encode, not EncodePrompt (no second BOS).
//
// Thread-safe: Apply may run on many threads at once.
#ifndef LAMINA_COMMON_CHAT_TEMPLATE_CHAT_TEMPLATE_H_
#define LAMINA_COMMON_CHAT_TEMPLATE_CHAT_TEMPLATE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace lamina {

namespace jinja {
struct Node;
}  // namespace jinja

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ... as the template expects
  std::string content;
};

class ChatTemplate {
 public:
  // Reads the template of the checkpoint in `dir`: `chat_template.jinja` when there is one (as
  // transformers saves it now), else `chat_template` in tokenizer_config.json (a string, or a list
  // of named templates, of which "default" is taken), else chat_template.json's. The special tokens
  // come from tokenizer_config.json. NotFound when the model has no template; InvalidArgument,
  // naming the file and line, when the template does not parse.
  static absl::StatusOr<ChatTemplate> Load(const std::string& dir);

  // Parses `source`; `label` names it in errors. `special_tokens` are the variables bos_token,
  // eos_token, ... with their text.
  static absl::StatusOr<ChatTemplate> Create(const std::string& source, std::string label,
                                             std::vector<std::pair<std::string, std::string>> special_tokens);

  // The prompt text for `messages`, ending with the assistant's turn opened when
  // `add_generation_prompt`. InvalidArgument when the template refuses the conversation (its
  // raise_exception, e.g. roles that do not alternate), quoting its message, or fails on it, naming
  // the template's line.
  absl::StatusOr<std::string> Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  const std::string& label() const { return label_; }

 private:
  using Body = std::vector<std::unique_ptr<jinja::Node>>;
  ChatTemplate(std::shared_ptr<const Body> body, std::string label,
               std::vector<std::pair<std::string, std::string>> special_tokens)
      : body_(std::move(body)), label_(std::move(label)), special_tokens_(std::move(special_tokens)) {}

  std::shared_ptr<const Body> body_;
  std::string label_;
  std::vector<std::pair<std::string, std::string>> special_tokens_;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_CHAT_TEMPLATE_CHAT_TEMPLATE_H_
