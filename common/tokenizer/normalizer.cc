#include "common/tokenizer/normalizer.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/status/status_macros.h"
#include "unicode/normalizer2.h"
#include "unicode/unistr.h"

namespace lamina {
namespace {

std::string IcuNormalize(const std::string& text, bool compatibility) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = compatibility ? icu::Normalizer2::getNFKCInstance(status)
                                                     : icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) return text;
  icu::UnicodeString normalized = normalizer->normalize(icu::UnicodeString::fromUTF8(text), status);
  if (U_FAILURE(status)) return text;
  std::string out;
  normalized.toUTF8String(out);
  return out;
}

std::string Lowercase(const std::string& text) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
  u.toLower();
  std::string out;
  u.toUTF8String(out);
  return out;
}

}  // namespace

absl::Status Normalizer::AddSteps(const nlohmann::json& json, const std::string& label,
                                  std::vector<Step>* steps) {
  if (json.is_null()) return absl::OkStatus();
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": normalizer ", what));
  };
  if (!json.is_object() || !json.contains("type") || !json["type"].is_string()) {
    return bad("has no string 'type'");
  }
  const std::string type = json["type"];
  if (type == "Sequence") {
    if (!json.contains("normalizers") || !json["normalizers"].is_array()) {
      return bad("Sequence has no list 'normalizers'");
    }
    for (const auto& child : json["normalizers"]) LAMINA_RETURN_IF_ERROR(AddSteps(child, label, steps));
  } else if (type == "Prepend") {
    if (!json.contains("prepend") || !json["prepend"].is_string()) return bad("Prepend has no string 'prepend'");
    steps->push_back({Step::Kind::kPrepend, "", json["prepend"]});
  } else if (type == "Replace") {
    const auto& pattern = json.value("pattern", nlohmann::json());
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string()) {
      return bad("Replace needs a literal {\"String\": ...} pattern (regex patterns are not supported)");
    }
    if (!json.contains("content") || !json["content"].is_string()) return bad("Replace has no string 'content'");
    steps->push_back({Step::Kind::kReplace, pattern["String"], json["content"]});
  } else if (type == "NFC") {
    steps->push_back({Step::Kind::kNfc, "", ""});
  } else if (type == "NFKC") {
    steps->push_back({Step::Kind::kNfkc, "", ""});
  } else if (type == "Lowercase") {
    steps->push_back({Step::Kind::kLowercase, "", ""});
  } else {
    return bad(absl::StrCat("type '", type,
                            "' is not supported (supported: Sequence, Prepend, Replace, NFC, NFKC, "
                            "Lowercase)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Normalizer> Normalizer::Create(const nlohmann::json& json, const std::string& label) {
  Normalizer normalizer;
  LAMINA_RETURN_IF_ERROR(AddSteps(json, label, &normalizer.steps_));
  return normalizer;
}

std::string Normalizer::Apply(const std::string& text) const {
  std::string out = text;
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kPrepend:
        if (!out.empty()) out = step.content + out;  // As in tokenizers: never on empty text.
        break;
      case Step::Kind::kReplace:
        if (!step.pattern.empty()) out = absl::StrReplaceAll(out, {{step.pattern, step.content}});
        break;
      case Step::Kind::kNfc:
        out = IcuNormalize(out, /*compatibility=*/false);
        break;
      case Step::Kind::kNfkc:
        out = IcuNormalize(out, /*compatibility=*/true);
        break;
      case Step::Kind::kLowercase:
        out = Lowercase(out);
        break;
    }
  }
  return out;
}

}  // namespace lamina
