// The tokenizer of a model folder, with config.json's bos_token_id taking precedence over the
// tokenizer's own idea of it (as Hugging Face does).
#ifndef LAMINA_COMMON_TOKENIZER_MODEL_TOKENIZER_H_
#define LAMINA_COMMON_TOKENIZER_MODEL_TOKENIZER_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/model_config/model_config.h"
#include "common/tokenizer/tokenizer.h"

namespace lamina {

// InvalidArgument when the tokenizer has more tokens than config.json's vocab_size.
absl::StatusOr<Tokenizer> LoadModelTokenizer(const std::string& dir, const ModelConfig& config);

}  // namespace lamina

#endif  // LAMINA_COMMON_TOKENIZER_MODEL_TOKENIZER_H_
