#include "common/chat_template/chat_template.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/golden.h"
#include "tests/support/temp_dir.h"

namespace lamina {
namespace {

using ::lamina::testing::ModelDir;
using ::lamina::testing::TempDir;

// Llama 3's template, as its tokenizer_config.json ships it.
constexpr char kLlama3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

const std::vector<ChatMessage> kChat = {{"system", "Be brief."}, {"user", " Hi there \n"}};
constexpr char kLlama3Chat[] =
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";

std::string TokenizerConfig(const nlohmann::json& chat_template) {
  nlohmann::json config = {{"bos_token", {{"__type", "AddedToken"}, {"content", "<|begin_of_text|>"}}},
                           {"eos_token", "<|eot_id|>"},
                           {"add_bos_token", true}};
  if (!chat_template.is_null()) config["chat_template"] = chat_template;
  return config.dump();
}

TEST(ChatTemplateTest, LoadsTokenizerConfigsTemplateWithItsSpecialTokens) {
  TempDir dir;
  dir.Write("tokenizer_config.json", TokenizerConfig(kLlama3));
  absl::StatusOr<ChatTemplate> chat = ChatTemplate::Load(dir.path());
  ASSERT_TRUE(chat.ok()) << chat.status();
  absl::StatusOr<std::string> text = chat->Apply(kChat, /*add_generation_prompt=*/true);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, kLlama3Chat);
  absl::StatusOr<std::string> closed = chat->Apply(kChat, /*add_generation_prompt=*/false);
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(*closed + "<|start_header_id|>assistant<|end_header_id|>\n\n", kLlama3Chat);
}

TEST(ChatTemplateTest, ChatTemplateJinjaWinsAndNamedListsGiveTheDefault) {
  TempDir dir;
  dir.Write("tokenizer_config.json",
            TokenizerConfig(
                nlohmann::json::array({{{"name", "tool_use"}, {"template", "tools"}},
                                       {{"name", "default"}, {"template", "{{ eos_token }}{{ messages|length }}"}}})));
  absl::StatusOr<ChatTemplate> listed = ChatTemplate::Load(dir.path());
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(*listed->Apply(kChat, true), "<|eot_id|>2");

  dir.Write("chat_template.jinja", "{% for m in messages %}{{ m.role[0] }}{% endfor %}\n");
  absl::StatusOr<ChatTemplate> file = ChatTemplate::Load(dir.path());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*file->Apply(kChat, true), "su");
  EXPECT_NE(file->label().find("chat_template.jinja"), std::string::npos);
}

TEST(ChatTemplateTest, MissingOrBrokenTemplatesSayWhereAndWhy) {
  TempDir none;
  none.Write("tokenizer_config.json", TokenizerConfig(nullptr));
  absl::StatusOr<ChatTemplate> missing = ChatTemplate::Load(none.path());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(none.path()), absl::string_view::npos) << missing.status();

  TempDir no_default;
  no_default.Write("tokenizer_config.json",
                   TokenizerConfig(nlohmann::json::array({{{"name", "rag"}, {"template", "x"}}})));
  absl::StatusOr<ChatTemplate> unnamed = ChatTemplate::Load(no_default.path());
  EXPECT_EQ(unnamed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unnamed.status().message().find("no template named 'default' (it has: rag)"), absl::string_view::npos)
      << unnamed.status();

  TempDir broken;
  broken.Write("tokenizer_config.json", TokenizerConfig("{% for m in messages %}\n{{ m.content }"));
  absl::StatusOr<ChatTemplate> bad = ChatTemplate::Load(broken.path());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tokenizer_config.json chat_template: line 2:"), absl::string_view::npos)
      << bad.status();
}

TEST(ChatTemplateTest, ARefusedConversationQuotesTheTemplate) {
  absl::StatusOr<ChatTemplate> chat = ChatTemplate::Create(
      "{% for m in messages %}{% if (m.role == 'user') != loop.index0 is even %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}{% endfor %}",
      "test template", {});
  ASSERT_TRUE(chat.ok()) << chat.status();
  absl::StatusOr<std::string> text = chat->Apply({{"user", "a"}, {"user", "b"}}, true);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(),
            "the chat template (test template) refused the conversation: line 1: Conversation roles must alternate "
            "user/assistant");
  EXPECT_TRUE(chat->Apply({{"user", "a"}, {"assistant", "b"}}, true).ok());
}

TEST(ChatTemplateTest, RenderedSpecialTokensEncodeToTheirIdsWithOneBos) {
  // The demo model's tokenizer has Llama 3's <|begin_of_text|> and <|eot_id|>.
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  absl::StatusOr<ChatTemplate> chat =
      ChatTemplate::Create(kLlama3, "llama3", {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}});
  ASSERT_TRUE(chat.ok()) << chat.status();
  absl::StatusOr<std::string> text = chat->Apply(kChat, true);
  ASSERT_TRUE(text.ok()) << text.status();
  const std::vector<int32_t> ids = tokenizer->Encode(*text);
  ASSERT_TRUE(tokenizer->bos_id().has_value());
  const int32_t bos = *tokenizer->bos_id();
  const int32_t eot = 1023;
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], bos);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), bos), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eot), 2);
  EXPECT_EQ(tokenizer->Decode(ids), *text);
}

}  // namespace
}  // namespace lamina
