// The model hyper-parameters Lamina needs, read from a Hugging Face config.json.
//
// Supports LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM: MHA, GQA and MQA; an explicit
// head_dim; RoPE as top-level rope_theta/rope_scaling (transformers 4) or rope_parameters
// (transformers 5), types "default", "linear" and "llama3"; tied embeddings; attention bias;
// bos/eos ids as a number or a list; sliding-window attention (Mistral, Qwen2 use_sliding_window).
// Every error names the file and the field.
#ifndef LAMINA_COMMON_MODEL_CONFIG_MODEL_CONFIG_H_
#define LAMINA_COMMON_MODEL_CONFIG_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lamina {

struct RopeConfig {
  enum class Type { kDefault, kLinear, kLlama3 };
  Type type = Type::kDefault;
  double theta = 10000.0;
  double factor = 1.0;  // linear and llama3
  // llama3 only:
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // bias on q, k and v projections
  int64_t sliding_window = 0;   // 0: full attention; else a query sees the last N positions
  std::vector<int64_t> bos_token_ids;
  std::vector<int64_t> eos_token_ids;
  // The checkpoint's element type as config.json names it ("dtype", or "torch_dtype" before
  // transformers 5): "bfloat16", "float16", "float32"; empty when it says none.
  std::string dtype;

  int64_t q_size() const { return num_q_heads * head_dim; }
  int64_t kv_size() const { return num_kv_heads * head_dim; }
  int64_t qkv_size() const { return q_size() + 2 * kv_size(); }
};

// Parses the JSON text of a config.json; `label` names it in errors.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& label);
// Reads and parses `dir`/config.json. When `dir`/generation_config.json is there, its
// eos_token_id ids join config.json's (chat models end a turn with one only it lists, such as
// Llama 3's <|eot_id|>); InvalidArgument names that file when it is malformed.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);
// Adds generation_config.json's eos_token_id ids (JSON text; `label` names it) to `config`'s.
absl::Status AddGenerationConfigEos(const std::string& json_text, const std::string& label, ModelConfig* config);

}  // namespace lamina

#endif  // LAMINA_COMMON_MODEL_CONFIG_MODEL_CONFIG_H_
