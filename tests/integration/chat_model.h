// The demo model with a Llama 3 style chat template, for tests of chats through a cluster.
#ifndef LAMINA_TESTS_INTEGRATION_CHAT_MODEL_H_
#define LAMINA_TESTS_INTEGRATION_CHAT_MODEL_H_

#include <fstream>

#include "nlohmann/json.hpp"
#include "tests/support/golden.h"
#include "tests/support/temp_dir.h"

namespace lamina::testing {

// Llama 3's turns, with the alternation check Llama 2's and Mistral's templates make.
inline constexpr char kTemplate[] =
    "{% for message in messages %}"
    "{% if message['role'] != 'system' and (message['role'] == 'user') != (loop.index0 % 2 == (0 if messages[0]"
    "['role'] != 'system' else 1)) %}{{ raise_exception('Conversation roles must alternate user/assistant') }}"
    "{% endif %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.first %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}";

// The demo model with kTemplate in its tokenizer_config.json.
inline void WriteChatModel(const TempDir& dir) {
  dir.CopyFrom(ModelDir("lamina-demo-6m"));
  std::ifstream in(dir.path() + "/tokenizer_config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["chat_template"] = kTemplate;
  dir.Write("tokenizer_config.json", config.dump(1));
}

}  // namespace lamina::testing

#endif  // LAMINA_TESTS_INTEGRATION_CHAT_MODEL_H_
