#include "common/tokenizer/token_decoder.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/status/status_macros.h"
#include "common/tokenizer/byte_level.h"

namespace lamina {
namespace {

// "<0xAB>" -> 0xAB; -1 when `token` is not a byte token.
int ParseByteToken(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (int i = 3; i < 5; ++i) {
    char c = token[i];
    int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

}  // namespace

absl::Status TokenDecoder::AddStep(const nlohmann::json& json, const std::string& label) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": decoder ", what));
  };
  if (!json.is_object() || !json.contains("type") || !json["type"].is_string()) {
    return bad("has no string 'type'");
  }
  const std::string type = json["type"];
  if (type == "Sequence") {
    if (!json.contains("decoders") || !json["decoders"].is_array()) return bad("Sequence has no list 'decoders'");
    for (const auto& child : json["decoders"]) LAMINA_RETURN_IF_ERROR(AddStep(child, label));
  } else if (type == "ByteLevel") {
    byte_level_ = true;
  } else if (type == "ByteFallback") {
    byte_fallback_ = true;
  } else if (type == "Fuse") {
    // Joining tokens is what TokenBytes' callers do anyway.
  } else if (type == "Replace") {
    const auto& pattern = json.value("pattern", nlohmann::json());
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string() ||
        !json.contains("content") || !json["content"].is_string()) {
      return bad("Replace needs a literal {\"String\": ...} pattern and a string 'content'");
    }
    replacements_.emplace_back(pattern["String"], json["content"]);
  } else if (type == "Strip") {
    if (json.value("content", " ") != " " || json.value("stop", 0) != 0) {
      return bad("Strip is supported only for leading spaces");
    }
    strip_leading_spaces_ = json.value("start", 0);
  } else if (type == "Metaspace") {
    std::string replacement = json.value("replacement", "\xe2\x96\x81");
    replacements_.emplace_back(replacement, " ");
    std::string scheme = json.contains("prepend_scheme") && json["prepend_scheme"].is_string()
                             ? json["prepend_scheme"].get<std::string>()
                             : (json.value("add_prefix_space", true) ? "always" : "never");
    if (scheme != "never") strip_leading_spaces_ = 1;
  } else {
    return bad(absl::StrCat("type '", type,
                            "' is not supported (supported: ByteLevel, Metaspace, Sequence, Replace, "
                            "ByteFallback, Fuse, Strip)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenDecoder> TokenDecoder::Create(const nlohmann::json& json, const std::string& label) {
  TokenDecoder decoder;
  if (!json.is_null()) LAMINA_RETURN_IF_ERROR(decoder.AddStep(json, label));
  return decoder;
}

std::string TokenDecoder::TokenBytes(const std::string& token) const {
  if (byte_fallback_) {
    int byte = ParseByteToken(token);
    if (byte >= 0) return std::string(1, static_cast<char>(byte));
  }
  std::string text = token;
  for (const auto& [from, to] : replacements_) text = absl::StrReplaceAll(text, {{from, to}});
  if (byte_level_) text = byte_level::Decode(text);
  return text;
}

}  // namespace lamina
