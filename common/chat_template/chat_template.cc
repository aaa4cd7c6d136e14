#include "common/chat_template/chat_template.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/chat_template/lexer.h"
#include "common/chat_template/parser.h"
#include "common/chat_template/renderer.h"
#include "common/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace lamina {
namespace {

// The text of `path`, or NotFound when there is no such file.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<nlohmann::json> ReadJson(const std::string& path) {
  LAMINA_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return json;
}

// tokenizer_config.json gives a special token as its text or as {"content": text, ...}.
std::vector<std::pair<std::string, std::string>> SpecialTokens(const nlohmann::json& config) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* name :
       {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}) {
    if (!config.contains(name)) continue;
    const nlohmann::json& token = config.at(name);
    if (token.is_string()) out.emplace_back(name, token.get<std::string>());
    if (token.is_object() && token.contains("content") && token.at("content").is_string()) {
      out.emplace_back(name, token.at("content").get<std::string>());
    }
  }
  return out;
}

// tokenizer_config.json's chat_template: a string, or [{"name": ..., "template": ...}, ...].
absl::StatusOr<std::string> TemplateField(const nlohmann::json& field, const std::string& label) {
  if (field.is_string()) return field.get<std::string>();
  if (!field.is_array()) return absl::InvalidArgumentError(absl::StrCat(label, ": must be a string or a list"));
  std::vector<std::string> names;
  for (const nlohmann::json& entry : field) {
    if (!entry.is_object() || !entry.contains("name") || !entry.at("name").is_string() || !entry.contains("template") ||
        !entry.at("template").is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": each entry must have a string name and template"));
    }
    names.push_back(entry.at("name").get<std::string>());
    if (names.back() == "default") return entry.at("template").get<std::string>();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(label, ": has no template named 'default' (it has: ", absl::StrJoin(names, ", "), ")"));
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Load(const std::string& dir) {
  const std::string config_path = dir + "/tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  absl::StatusOr<nlohmann::json> read = ReadJson(config_path);
  if (read.ok()) {
    config = *std::move(read);
  } else if (!absl::IsNotFound(read.status())) {
    return read.status();
  }
  std::vector<std::pair<std::string, std::string>> special = SpecialTokens(config);

  const std::string jinja_path = dir + "/chat_template.jinja";
  absl::StatusOr<std::string> source = ReadFile(jinja_path);
  if (source.ok()) return Create(*source, jinja_path, std::move(special));
  if (config.contains("chat_template") && !config.at("chat_template").is_null()) {
    const std::string label = config_path + " chat_template";
    LAMINA_ASSIGN_OR_RETURN(std::string text, TemplateField(config.at("chat_template"), label));
    return Create(text, label, std::move(special));
  }
  const std::string json_path = dir + "/chat_template.json";
  absl::StatusOr<nlohmann::json> processor = ReadJson(json_path);
  if (processor.ok() && processor->contains("chat_template")) {
    const std::string label = json_path + " chat_template";
    LAMINA_ASSIGN_OR_RETURN(std::string text, TemplateField(processor->at("chat_template"), label));
    return Create(text, label, std::move(special));
  }
  return absl::NotFoundError(absl::StrCat(
      dir, " has no chat template (no chat_template.jinja, and no chat_template in ", "tokenizer_config.json)"));
}

absl::StatusOr<ChatTemplate> ChatTemplate::Create(const std::string& source, std::string label,
                                                  std::vector<std::pair<std::string, std::string>> special_tokens) {
  absl::StatusOr<std::vector<jinja::Token>> tokens = jinja::Tokenize(source);
  absl::StatusOr<jinja::Body> body = tokens.ok() ? jinja::Parse(*tokens) : tokens.status();
  if (!body.ok()) return absl::InvalidArgumentError(absl::StrCat(label, ": ", body.status().message()));
  return ChatTemplate(std::make_shared<const Body>(*std::move(body)), std::move(label), std::move(special_tokens));
}

absl::StatusOr<std::string> ChatTemplate::Apply(const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt) const {
  jinja::ValueList list;
  for (const ChatMessage& m : messages) {
    list.push_back(jinja::Value::Dict({{"role", jinja::Value(m.role)}, {"content", jinja::Value(m.content)}}));
  }
  jinja::ValueDict variables = {{"messages", jinja::Value::List(std::move(list))},
                                {"add_generation_prompt", jinja::Value(add_generation_prompt)}};
  for (const auto& [name, text] : special_tokens_) variables.emplace_back(name, jinja::Value(text));
  absl::StatusOr<std::string> text = jinja::Render(*body_, variables);
  if (text.ok()) return text;
  if (absl::IsFailedPrecondition(text.status())) {
    return absl::InvalidArgumentError(
        absl::StrCat("the chat template (", label_, ") refused the conversation: ", text.status().message()));
  }
  return absl::InvalidArgumentError(absl::StrCat(label_, ": ", text.status().message()));
}

}  // namespace lamina
