#include "common/tokenizer/pre_tokenizer.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/status/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "unicode/regex.h"
#include "unicode/unistr.h"

namespace lamina {
namespace {

// GPT-2's split pattern, used by ByteLevel when use_regex is true.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

absl::StatusOr<std::shared_ptr<icu::RegexPattern>> CompileRegex(const std::string& pattern,
                                                                const std::string& label) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse_error;
  std::shared_ptr<icu::RegexPattern> regex(
      icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern), 0, parse_error, status));
  if (U_FAILURE(status) || regex == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": pre_tokenizer regex '", pattern,
                                                   "' does not compile: ", u_errorName(status)));
  }
  return regex;
}

std::string ToUtf8(const icu::UnicodeString& u, int32_t begin, int32_t end) {
  std::string out;
  u.tempSubStringBetween(begin, end).toUTF8String(out);
  return out;
}

// Splits `text` at the matches of `regex`, keeping matches as pieces unless `remove_matches`.
std::vector<std::string> SplitByRegex(const icu::RegexPattern& regex, const std::string& text,
                                      bool remove_matches) {
  std::vector<std::string> pieces;
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> matcher(regex.matcher(u, status));
  if (U_FAILURE(status)) return {text};
  int32_t previous = 0;
  while (matcher->find(status) && U_SUCCESS(status)) {
    int32_t begin = matcher->start(status);
    int32_t end = matcher->end(status);
    if (begin == end) continue;  // Empty matches do not split.
    if (begin > previous) pieces.push_back(ToUtf8(u, previous, begin));
    if (!remove_matches) pieces.push_back(ToUtf8(u, begin, end));
    previous = end;
  }
  if (previous < u.length()) pieces.push_back(ToUtf8(u, previous, u.length()));
  return pieces;
}

}  // namespace

absl::Status PreTokenizer::AddSteps(const nlohmann::json& json, const std::string& label,
                                    std::vector<Step>* steps, bool* byte_level) {
  if (json.is_null()) return absl::OkStatus();
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": pre_tokenizer ", what));
  };
  if (!json.is_object() || !json.contains("type") || !json["type"].is_string()) {
    return bad("has no string 'type'");
  }
  const std::string type = json["type"];
  if (type == "Sequence") {
    if (!json.contains("pretokenizers") || !json["pretokenizers"].is_array()) {
      return bad("Sequence has no list 'pretokenizers'");
    }
    for (const auto& child : json["pretokenizers"]) {
      LAMINA_RETURN_IF_ERROR(AddSteps(child, label, steps, byte_level));
    }
  } else if (type == "Split") {
    Step step{Step::Kind::kSplit};
    const auto& pattern = json.value("pattern", nlohmann::json());
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      LAMINA_ASSIGN_OR_RETURN(step.regex, CompileRegex(pattern["Regex"], label));
    } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
      std::string literal = pattern["String"];
      LAMINA_ASSIGN_OR_RETURN(step.regex, CompileRegex("\\Q" + literal + "\\E", label));
    } else {
      return bad("Split needs a pattern {\"Regex\": ...} or {\"String\": ...}");
    }
    const std::string behavior = json.value("behavior", "Isolated");
    if (behavior != "Isolated" && behavior != "Removed") {
      return bad(absl::StrCat("Split behavior '", behavior, "' is not supported (Isolated, Removed)"));
    }
    if (json.value("invert", false)) return bad("Split with invert=true is not supported");
    step.remove_matches = behavior == "Removed";
    steps->push_back(std::move(step));
  } else if (type == "ByteLevel") {
    // The prefix space goes in before any split, as in tokenizers.
    if (json.value("add_prefix_space", false)) steps->push_back(Step{Step::Kind::kPrefixSpace});
    if (json.value("use_regex", true)) {
      Step split{Step::Kind::kSplit};
      LAMINA_ASSIGN_OR_RETURN(split.regex, CompileRegex(kGpt2Pattern, label));
      steps->push_back(std::move(split));
    }
    steps->push_back(Step{Step::Kind::kByteLevel});
    *byte_level = true;
  } else if (type == "Metaspace") {
    Step step{Step::Kind::kMetaspace};
    step.replacement = json.value("replacement", "\xe2\x96\x81");
    if (json.contains("prepend_scheme") && json["prepend_scheme"].is_string()) {
      step.prepend_scheme = json["prepend_scheme"];
    } else {
      step.prepend_scheme = json.value("add_prefix_space", true) ? "always" : "never";
    }
    if (step.prepend_scheme != "always" && step.prepend_scheme != "first" &&
        step.prepend_scheme != "never") {
      return bad(absl::StrCat("Metaspace prepend_scheme '", step.prepend_scheme, "' is unknown"));
    }
    step.split = json.value("split", true);
    steps->push_back(std::move(step));
  } else {
    return bad(absl::StrCat("type '", type,
                            "' is not supported (supported: Sequence, Split, ByteLevel, Metaspace)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PreTokenizer> PreTokenizer::Create(const nlohmann::json& json, const std::string& label) {
  PreTokenizer pre;
  LAMINA_RETURN_IF_ERROR(AddSteps(json, label, &pre.steps_, &pre.byte_level_));
  return pre;
}

std::vector<std::string> PreTokenizer::RunStep(const Step& step, const std::string& piece,
                                               bool first_piece) {
  switch (step.kind) {
    case Step::Kind::kSplit:
      return SplitByRegex(*step.regex, piece, step.remove_matches);
    case Step::Kind::kPrefixSpace:
      if (first_piece && !piece.empty() && piece[0] != ' ') return {" " + piece};
      return {piece};
    case Step::Kind::kByteLevel:
      return {byte_level::Encode(piece)};
    case Step::Kind::kMetaspace: {
      std::string text = absl::StrReplaceAll(piece, {{" ", step.replacement}});
      bool prepend = step.prepend_scheme == "always" || (step.prepend_scheme == "first" && first_piece);
      if (prepend && text.compare(0, step.replacement.size(), step.replacement) != 0) {
        text = step.replacement + text;
      }
      if (!step.split) return {text};
      // Each piece starts at a replacement character (tokenizers' MergedWithNext).
      std::vector<std::string> pieces;
      size_t start = 0;
      for (size_t pos = text.find(step.replacement, 1); pos != std::string::npos;
           pos = text.find(step.replacement, pos + step.replacement.size())) {
        pieces.push_back(text.substr(start, pos - start));
        start = pos;
      }
      pieces.push_back(text.substr(start));
      return pieces;
    }
  }
  return {piece};
}

std::vector<std::string> PreTokenizer::Apply(const std::string& text, bool first_segment) const {
  std::vector<std::string> pieces = {text};
  for (const Step& step : steps_) {
    std::vector<std::string> next;
    for (size_t i = 0; i < pieces.size(); ++i) {
      for (std::string& piece : RunStep(step, pieces[i], first_segment && i == 0)) {
        if (!piece.empty()) next.push_back(std::move(piece));
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

}  // namespace lamina
