// A Hugging Face tokenizer.json (BPE models) with the special-token settings of its folder.
//
// Encode: added tokens are matched first (longest at each position); the text between them goes
// through the normalizer, the pre-tokenizer and BPE. Decode joins each token's bytes; the result
// is valid UTF-8 (invalid bytes become U+FFFD). Load errors name the file and the part that is
// wrong. Thread-safe after Load(): all methods are const.
#ifndef LAMINA_COMMON_TOKENIZER_TOKENIZER_H_
#define LAMINA_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/token_decoder.h"

namespace lamina {

class Tokenizer {
 public:
  // Reads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json (add_bos_token,
  // bos_token).
  static absl::StatusOr<Tokenizer> Load(const std::string& dir);
  // Parses tokenizer.json text; `label` names it in errors.
  static absl::StatusOr<Tokenizer> FromJson(const std::string& json_text, const std::string& label);

  // Token ids of `text`, with no BOS or other special tokens added.
  std::vector<int32_t> Encode(std::string_view text) const;
  // Encode() with the BOS the model expects in front, when it expects one.
  std::vector<int32_t> EncodePrompt(std::string_view text) const;

  // Text of `ids`, as tokenizers' decode: the first token loses the decoder's added prefix space.
  // With `skip_special`, control tokens (BOS, EOS, ...) are left out.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special = false) const;

  // The raw bytes token `id` contributes in the middle of a text ("" for control tokens and ids
  // out of range); may be part of a multi-byte character.
  const std::string& TokenBytes(int32_t id) const;
  // Token `id` on its own, for display (log probabilities): its bytes with invalid UTF-8 (a piece
  // of a multi-byte character) as U+FFFD, or a control token's content ("</s>"); "" out of range.
  std::string TokenText(int32_t id) const;
  bool IsControl(int32_t id) const;
  int strip_leading_spaces() const { return decoder_.strip_leading_spaces(); }

  int32_t vocab_size() const { return static_cast<int32_t>(token_bytes_.size()); }
  std::optional<int32_t> bos_id() const { return bos_id_; }
  bool add_bos() const { return add_bos_ && bos_id_.has_value(); }
  // Sets the BOS policy (from the model's config.json, which takes precedence).
  void SetBos(std::optional<int32_t> bos_id, bool add_bos) {
    bos_id_ = bos_id;
    add_bos_ = add_bos;
  }

 private:
  struct AddedToken {
    std::string content;
    int32_t id;
  };

  Tokenizer() = default;
  void EncodeSegment(const std::string& text, bool first_segment, std::vector<int32_t>* ids) const;

  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  BpeModel model_;
  TokenDecoder decoder_;
  std::vector<AddedToken> added_tokens_;  // longest content first
  std::vector<std::string> token_bytes_;  // [vocab_size]
  std::vector<bool> is_control_;          // [vocab_size]
  std::optional<int32_t> bos_id_;
  bool add_bos_ = false;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_TOKENIZER_TOKENIZER_H_
