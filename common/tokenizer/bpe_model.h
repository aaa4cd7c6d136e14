// The BPE "model" of a tokenizer.json: vocabulary, ranked merges, unknown-token and byte-fallback
// handling. Encodes one pre-tokenized piece at a time, merging the lowest-ranked pair first (the
// leftmost on ties), as Hugging Face tokenizers does; O(n log n) in the piece's length.
// Thread-safe after Create().
#ifndef LAMINA_COMMON_TOKENIZER_BPE_MODEL_H_
#define LAMINA_COMMON_TOKENIZER_BPE_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace lamina {

class BpeModel {
 public:
  // `json` is the "model" value of tokenizer.json; its "type" must be "BPE".
  static absl::StatusOr<BpeModel> Create(const nlohmann::json& json, const std::string& label);

  void Encode(const std::string& piece, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenId(const std::string& token) const;
  // The vocabulary entries as id -> token string; ids without an entry map to "".
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }
  void AppendUnknownOrBytes(const std::string& character, std::vector<int32_t>* symbols) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xXX> token ids when byte_fallback, else -1
};

}  // namespace lamina

#endif  // LAMINA_COMMON_TOKENIZER_BPE_MODEL_H_
