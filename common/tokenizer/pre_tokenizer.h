// The "pre_tokenizer" stage of a tokenizer.json: splits normalized text into pieces that BPE
// encodes independently. Supported: Sequence; Split with a regex or literal pattern and behavior
// Isolated or Removed (regexes run on ICU, which knows \p{L}, \p{N}, lookahead and (?i:...));
// ByteLevel (with or without GPT-2's regex); Metaspace (prepend_scheme always/first/never, split).
// Thread-safe after Create(): compiled patterns are shared read-only and matchers are per call.
#ifndef LAMINA_COMMON_TOKENIZER_PRE_TOKENIZER_H_
#define LAMINA_COMMON_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "unicode/regex.h"

namespace lamina {

class PreTokenizer {
 public:
  // `json` is the "pre_tokenizer" value (null means none).
  static absl::StatusOr<PreTokenizer> Create(const nlohmann::json& json, const std::string& label);

  // `first_segment`: the text starts the input (not after an added token); Metaspace's "first"
  // prepend scheme uses it.
  std::vector<std::string> Apply(const std::string& text, bool first_segment) const;

  // Whether a ByteLevel step maps bytes to printable characters (so BPE sees byte-level text).
  bool byte_level() const { return byte_level_; }

 private:
  struct Step {
    enum class Kind { kSplit, kPrefixSpace, kByteLevel, kMetaspace };
    explicit Step(Kind k) : kind(k) {}
    Kind kind;
    std::shared_ptr<icu::RegexPattern> regex;  // kSplit, and kByteLevel with use_regex
    bool remove_matches = false;               // kSplit: behavior Removed
    std::string replacement;                   // kMetaspace
    std::string prepend_scheme;                // kMetaspace: always, first, never
    bool split = true;                         // kMetaspace
  };
  static absl::Status AddSteps(const nlohmann::json& json, const std::string& label,
                               std::vector<Step>* steps, bool* byte_level);
  static std::vector<std::string> RunStep(const Step& step, const std::string& piece,
                                          bool first_piece);

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_TOKENIZER_PRE_TOKENIZER_H_
