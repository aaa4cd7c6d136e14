// The "decoder" stage of a tokenizer.json, reduced to what streaming needs: the bytes each token
// contributes, and how many leading spaces to strip at the very start of a text.
// Supported: ByteLevel; Metaspace; Sequence of Replace (literal), ByteFallback, Fuse and Strip.
// Thread-safe after Create().
#ifndef LAMINA_COMMON_TOKENIZER_TOKEN_DECODER_H_
#define LAMINA_COMMON_TOKENIZER_TOKEN_DECODER_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace lamina {

class TokenDecoder {
 public:
  // `json` is the "decoder" value (null: token strings are the text).
  static absl::StatusOr<TokenDecoder> Create(const nlohmann::json& json, const std::string& label);

  // The bytes a vocabulary token string stands for.
  std::string TokenBytes(const std::string& token) const;
  // Leading spaces removed from a text's first token (SentencePiece's added prefix space).
  int strip_leading_spaces() const { return strip_leading_spaces_; }

 private:
  absl::Status AddStep(const nlohmann::json& json, const std::string& label);

  bool byte_level_ = false;
  bool byte_fallback_ = false;
  std::vector<std::pair<std::string, std::string>> replacements_;
  int strip_leading_spaces_ = 0;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_TOKENIZER_TOKEN_DECODER_H_
