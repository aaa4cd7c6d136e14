#include "common/tokenizer/model_tokenizer.h"

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

namespace lamina {

absl::StatusOr<Tokenizer> LoadModelTokenizer(const std::string& dir, const ModelConfig& config) {
  LAMINA_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Load(dir));
  if (tokenizer.vocab_size() > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/tokenizer.json: has ", tokenizer.vocab_size(),
                                                   " tokens but config.json's vocab_size is ", config.vocab_size));
  }
  if (!config.bos_token_ids.empty()) tokenizer.SetBos(static_cast<int32_t>(config.bos_token_ids[0]), tokenizer.add_bos());
  return tokenizer;
}

}  // namespace lamina
