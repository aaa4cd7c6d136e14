// The "normalizer" stage of a tokenizer.json: a sequence of text rewrites applied before
// pre-tokenization. Supported: Sequence, Prepend, Replace (literal pattern), NFC, NFKC, Lowercase.
// Thread-safe after Create().
#ifndef LAMINA_COMMON_TOKENIZER_NORMALIZER_H_
#define LAMINA_COMMON_TOKENIZER_NORMALIZER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace lamina {

class Normalizer {
 public:
  // `json` is the "normalizer" value (null means none); `label` names the file in errors.
  static absl::StatusOr<Normalizer> Create(const nlohmann::json& json, const std::string& label);

  std::string Apply(const std::string& text) const;

 private:
  struct Step {
    enum class Kind { kPrepend, kReplace, kNfc, kNfkc, kLowercase };
    Kind kind;
    std::string pattern;  // kReplace
    std::string content;  // kPrepend, kReplace
  };
  static absl::Status AddSteps(const nlohmann::json& json, const std::string& label,
                               std::vector<Step>* steps);

  std::vector<Step> steps_;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_TOKENIZER_NORMALIZER_H_
