#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace lamina {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

bool IsByteToken(const std::string& token) {
  return token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>';
}

}  // namespace

absl::StatusOr<Tokenizer> Tokenizer::FromJson(const std::string& json_text, const std::string& label) {
  nlohmann::json json = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(label, ": not valid JSON"));
  if (!json.is_object()) return absl::InvalidArgumentError(absl::StrCat(label, ": not a JSON object"));
  // nlohmann's typed accessors throw on a value of the wrong type; report that as bad input.
  try {
    Tokenizer tokenizer;
    LAMINA_ASSIGN_OR_RETURN(tokenizer.normalizer_,
                            Normalizer::Create(json.value("normalizer", nlohmann::json()), label));
    LAMINA_ASSIGN_OR_RETURN(tokenizer.pre_tokenizer_,
                            PreTokenizer::Create(json.value("pre_tokenizer", nlohmann::json()), label));
    if (!json.contains("model")) return absl::InvalidArgumentError(absl::StrCat(label, ": no 'model'"));
    LAMINA_ASSIGN_OR_RETURN(tokenizer.model_, BpeModel::Create(json["model"], label));
    LAMINA_ASSIGN_OR_RETURN(tokenizer.decoder_,
                            TokenDecoder::Create(json.value("decoder", nlohmann::json()), label));

    std::vector<std::string> id_to_token = tokenizer.model_.id_to_token();
    std::vector<bool> special(id_to_token.size(), false);
    const nlohmann::json added = json.value("added_tokens", nlohmann::json::array());
    if (!added.is_array()) return absl::InvalidArgumentError(absl::StrCat(label, ": 'added_tokens' is not a list"));
    for (const auto& entry : added) {
      if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_number_integer() ||
          entry["id"].get<int64_t>() < 0 || entry["id"].get<int64_t>() > (1 << 24) ||
          !entry.contains("content") || !entry["content"].is_string() ||
          entry["content"].get<std::string>().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(label, ": added_tokens entry ", entry.dump(), " needs an id and non-empty content"));
      }
      int32_t id = entry["id"];
      std::string content = entry["content"];
      if (static_cast<size_t>(id) >= id_to_token.size()) {
        id_to_token.resize(id + 1);
        special.resize(id + 1, false);
      }
      id_to_token[id] = content;
      special[id] = entry.value("special", false);
      tokenizer.added_tokens_.push_back({content, id});
    }
    std::stable_sort(tokenizer.added_tokens_.begin(), tokenizer.added_tokens_.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });

    tokenizer.token_bytes_.resize(id_to_token.size());
    tokenizer.is_control_.resize(id_to_token.size());
    for (size_t id = 0; id < id_to_token.size(); ++id) {
      // Byte-fallback tokens are often marked special, yet they carry text.
      bool control = special[id] && !(tokenizer.model_.byte_fallback() && IsByteToken(id_to_token[id]));
      tokenizer.is_control_[id] = control;
      tokenizer.token_bytes_[id] = control ? id_to_token[id] : tokenizer.decoder_.TokenBytes(id_to_token[id]);
    }

    // A TemplateProcessing post-processor that starts with a special token adds a BOS.
    const nlohmann::json post = json.value("post_processor", nlohmann::json());
    if (post.is_object() && post.value("type", "") == "TemplateProcessing" && post.contains("single") &&
        post["single"].is_array() && !post["single"].empty() && post["single"][0].contains("SpecialToken")) {
      std::string bos = post["single"][0]["SpecialToken"].value("id", "");
      for (const AddedToken& t : tokenizer.added_tokens_) {
        if (t.content == bos) tokenizer.SetBos(t.id, true);
      }
    }
    return tokenizer;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": malformed: ", e.what()));
  }
}

absl::StatusOr<Tokenizer> Tokenizer::Load(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  LAMINA_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  LAMINA_ASSIGN_OR_RETURN(Tokenizer tokenizer, FromJson(text, path));

  const std::string config_path = dir + "/tokenizer_config.json";
  auto config_text = ReadFile(config_path);
  if (config_text.ok()) {
    nlohmann::json config = nlohmann::json::parse(*config_text, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
    }
    std::optional<int32_t> bos = tokenizer.bos_id_;
    if (config.contains("bos_token") && config["bos_token"].is_string()) {
      for (const AddedToken& t : tokenizer.added_tokens_) {
        if (t.content == config["bos_token"].get<std::string>()) bos = t.id;
      }
    }
    bool add_bos = tokenizer.add_bos_;
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
      add_bos = config["add_bos_token"];
    }
    tokenizer.SetBos(bos, add_bos);
  }
  return tokenizer;
}

void Tokenizer::EncodeSegment(const std::string& text, bool first_segment, std::vector<int32_t>* ids) const {
  if (text.empty()) return;
  for (const std::string& piece : pre_tokenizer_.Apply(normalizer_.Apply(text), first_segment)) {
    model_.Encode(piece, ids);
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  size_t segment_start = 0;
  size_t pos = 0;
  bool first_segment = true;
  while (pos < text.size()) {
    const AddedToken* match = nullptr;
    for (const AddedToken& token : added_tokens_) {
      if (text.compare(pos, token.content.size(), token.content) == 0) {
        match = &token;
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    EncodeSegment(std::string(text.substr(segment_start, pos - segment_start)), first_segment, &ids);
    first_segment = false;
    ids.push_back(match->id);
    pos += match->content.size();
    segment_start = pos;
  }
  EncodeSegment(std::string(text.substr(segment_start)), first_segment, &ids);
  return ids;
}

std::vector<int32_t> Tokenizer::EncodePrompt(std::string_view text) const {
  std::vector<int32_t> ids;
  if (add_bos()) ids.push_back(*bos_id_);
  std::vector<int32_t> body = Encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

const std::string& Tokenizer::TokenBytes(int32_t id) const {
  static const std::string kEmpty;
  if (id < 0 || id >= vocab_size() || is_control_[id]) return kEmpty;
  return token_bytes_[id];
}

std::string Tokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return utf8::Sanitize(token_bytes_[id]);
}

bool Tokenizer::IsControl(int32_t id) const { return id >= 0 && id < vocab_size() && is_control_[id]; }

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (is_control_[id]) {
      if (!skip_special) bytes += token_bytes_[id];
      continue;
    }
    bytes += token_bytes_[id];
  }
  int strip = decoder_.strip_leading_spaces();
  size_t begin = 0;
  while (strip-- > 0 && begin < bytes.size() && bytes[begin] == ' ') ++begin;
  return utf8::Sanitize(std::string_view(bytes).substr(begin));
}

}  // namespace lamina
