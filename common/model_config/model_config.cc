#include "common/model_config/model_config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace lamina {
namespace {

using Json = nlohmann::json;

constexpr const char* kSupportedArchitectures[] = {"LlamaForCausalLM", "MistralForCausalLM",
                                                   "Qwen2ForCausalLM"};

// Reads fields of one JSON object, naming the file and field in every error.
class FieldReader {
 public:
  FieldReader(const Json& object, std::string label) : object_(object), label_(std::move(label)) {}

  absl::Status Error(const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(label_, ": field '", field, "' ", what));
  }

  bool Has(const std::string& field) const {
    auto it = object_.find(field);
    return it != object_.end() && !it->is_null();
  }

  absl::StatusOr<int64_t> PositiveInt(const std::string& field) const {
    if (!Has(field)) return Error(field, "is missing");
    const Json& value = object_.at(field);
    if (!value.is_number_integer() || value.get<int64_t>() <= 0) {
      return Error(field, absl::StrCat("must be a positive integer, got ", value.dump()));
    }
    return value.get<int64_t>();
  }

  absl::StatusOr<int64_t> PositiveIntOr(const std::string& field, int64_t fallback) const {
    return Has(field) ? PositiveInt(field) : fallback;
  }

  // A size that buffers are allocated from: refused past `most`, before anything is allocated.
  absl::StatusOr<int64_t> Size(const std::string& field, int64_t most) const {
    LAMINA_ASSIGN_OR_RETURN(const int64_t value, PositiveInt(field));
    if (value > most) return Error(field, absl::StrCat("is ", value, "; at most ", most, " is supported"));
    return value;
  }

  absl::StatusOr<double> PositiveNumberOr(const std::string& field, double fallback) const {
    if (!Has(field)) return fallback;
    const Json& value = object_.at(field);
    if (!value.is_number() || value.get<double>() <= 0) {
      return Error(field, absl::StrCat("must be a positive number, got ", value.dump()));
    }
    return value.get<double>();
  }

  absl::StatusOr<bool> BoolOr(const std::string& field, bool fallback) const {
    if (!Has(field)) return fallback;
    const Json& value = object_.at(field);
    if (!value.is_boolean()) return Error(field, absl::StrCat("must be true or false, got ", value.dump()));
    return value.get<bool>();
  }

  absl::StatusOr<std::string> StringOr(const std::string& field, const std::string& fallback) const {
    if (!Has(field)) return fallback;
    const Json& value = object_.at(field);
    if (!value.is_string()) return Error(field, absl::StrCat("must be a string, got ", value.dump()));
    return value.get<std::string>();
  }

  // A token id given as a number or a list of numbers (bos/eos); empty when absent.
  absl::StatusOr<std::vector<int64_t>> TokenIds(const std::string& field) const {
    std::vector<int64_t> ids;
    if (!Has(field)) return ids;
    const Json& value = object_.at(field);
    auto add = [&](const Json& v) -> absl::Status {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) {
        return Error(field, absl::StrCat("must be a token id or a list of them, got ", value.dump()));
      }
      ids.push_back(v.get<int64_t>());
      return absl::OkStatus();
    };
    if (value.is_array()) {
      for (const Json& v : value) LAMINA_RETURN_IF_ERROR(add(v));
    } else {
      LAMINA_RETURN_IF_ERROR(add(value));
    }
    return ids;
  }

 private:
  const Json& object_;
  std::string label_;
};

absl::StatusOr<RopeConfig> ParseRope(const Json& config, const std::string& label) {
  // transformers 5 nests everything in rope_parameters; transformers 4 has rope_theta at the top
  // level and the scaling in rope_scaling.
  RopeConfig rope;
  const Json* scaling = nullptr;
  std::string scaling_label = label;
  FieldReader top(config, label);
  if (top.Has("rope_parameters")) {
    scaling = &config.at("rope_parameters");
    scaling_label = label + " rope_parameters";
    if (!scaling->is_object()) return top.Error("rope_parameters", "must be an object");
    FieldReader params(*scaling, scaling_label);
    LAMINA_ASSIGN_OR_RETURN(rope.theta, params.PositiveNumberOr("rope_theta", 10000.0));
  } else {
    LAMINA_ASSIGN_OR_RETURN(rope.theta, top.PositiveNumberOr("rope_theta", 10000.0));
    if (top.Has("rope_scaling")) {
      scaling = &config.at("rope_scaling");
      scaling_label = label + " rope_scaling";
      if (!scaling->is_object()) return top.Error("rope_scaling", "must be an object or null");
    }
  }
  if (scaling == nullptr) return rope;

  FieldReader params(*scaling, scaling_label);
  LAMINA_ASSIGN_OR_RETURN(std::string type, params.StringOr("rope_type", ""));
  if (type.empty()) {
    LAMINA_ASSIGN_OR_RETURN(type, params.StringOr("type", "default"));
  }
  if (type == "default") {
    rope.type = RopeConfig::Type::kDefault;
  } else if (type == "linear") {
    rope.type = RopeConfig::Type::kLinear;
    LAMINA_ASSIGN_OR_RETURN(rope.factor, params.PositiveNumberOr("factor", 1.0));
  } else if (type == "llama3") {
    rope.type = RopeConfig::Type::kLlama3;
    LAMINA_ASSIGN_OR_RETURN(rope.factor, params.PositiveNumberOr("factor", 8.0));
    LAMINA_ASSIGN_OR_RETURN(rope.low_freq_factor, params.PositiveNumberOr("low_freq_factor", 1.0));
    LAMINA_ASSIGN_OR_RETURN(rope.high_freq_factor, params.PositiveNumberOr("high_freq_factor", 4.0));
    LAMINA_ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                            params.PositiveIntOr("original_max_position_embeddings", 8192));
    if (rope.high_freq_factor <= rope.low_freq_factor) {
      return params.Error("high_freq_factor", "must be greater than low_freq_factor");
    }
  } else {
    return params.Error("rope_type", absl::StrCat("'", type,
                                                  "' is not supported (supported: default, "
                                                  "linear, llama3)"));
  }
  return rope;
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& label) {
  Json config = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(label, ": not valid JSON"));
  if (!config.is_object()) return absl::InvalidArgumentError(absl::StrCat(label, ": not a JSON object"));
  FieldReader reader(config, label);
  ModelConfig out;

  if (!reader.Has("architectures") || !config.at("architectures").is_array() ||
      config.at("architectures").empty() || !config.at("architectures")[0].is_string()) {
    return reader.Error("architectures", "must be a non-empty list of names");
  }
  out.architecture = config.at("architectures")[0].get<std::string>();
  bool supported = false;
  for (const char* name : kSupportedArchitectures) supported |= out.architecture == name;
  if (!supported) {
    return reader.Error("architectures",
                        absl::StrCat("names '", out.architecture, "', which Lamina does not support "
                                     "(supported: ",
                                     absl::StrJoin(kSupportedArchitectures, ", "), ")"));
  }

  LAMINA_ASSIGN_OR_RETURN(std::string act, reader.StringOr("hidden_act", "silu"));
  if (act != "silu") return reader.Error("hidden_act", absl::StrCat("is '", act, "'; only silu is supported"));

  // Bounds well past the largest open models' (Llama-3.1-405B: 126 layers, hidden 16384, 128
  // heads, vocabulary 128256), so that a corrupt or hostile config.json is refused rather than
  // allocated.
  LAMINA_ASSIGN_OR_RETURN(out.vocab_size, reader.Size("vocab_size", int64_t{1} << 24));
  LAMINA_ASSIGN_OR_RETURN(out.hidden_size, reader.Size("hidden_size", int64_t{1} << 17));
  LAMINA_ASSIGN_OR_RETURN(out.intermediate_size, reader.Size("intermediate_size", int64_t{1} << 20));
  LAMINA_ASSIGN_OR_RETURN(out.num_layers, reader.Size("num_hidden_layers", 1024));
  LAMINA_ASSIGN_OR_RETURN(out.num_q_heads, reader.Size("num_attention_heads", 1024));
  LAMINA_ASSIGN_OR_RETURN(out.num_kv_heads,
                          reader.Has("num_key_value_heads") ? reader.Size("num_key_value_heads", 1024)
                                                            : absl::StatusOr<int64_t>(out.num_q_heads));
  if (out.num_q_heads % out.num_kv_heads != 0) {
    return reader.Error("num_key_value_heads",
                        absl::StrCat("(", out.num_kv_heads, ") must divide num_attention_heads (",
                                     out.num_q_heads, ")"));
  }
  if (reader.Has("head_dim")) {
    LAMINA_ASSIGN_OR_RETURN(out.head_dim, reader.Size("head_dim", 1024));
  } else {
    if (out.hidden_size % out.num_q_heads != 0) {
      return reader.Error("hidden_size", "is not a multiple of num_attention_heads and no head_dim is given");
    }
    out.head_dim = out.hidden_size / out.num_q_heads;
  }
  if (out.head_dim % 2 != 0) return reader.Error("head_dim", "must be even for RoPE");
  LAMINA_ASSIGN_OR_RETURN(out.max_position_embeddings, reader.Size("max_position_embeddings", int64_t{1} << 24));
  LAMINA_ASSIGN_OR_RETURN(out.rms_norm_eps, reader.PositiveNumberOr("rms_norm_eps", 1e-6));
  LAMINA_ASSIGN_OR_RETURN(out.tie_word_embeddings, reader.BoolOr("tie_word_embeddings", false));
  LAMINA_ASSIGN_OR_RETURN(std::string torch_dtype, reader.StringOr("torch_dtype", ""));
  LAMINA_ASSIGN_OR_RETURN(out.dtype, reader.StringOr("dtype", torch_dtype));
  bool default_bias = out.architecture == "Qwen2ForCausalLM";
  LAMINA_ASSIGN_OR_RETURN(out.attention_bias, reader.BoolOr("attention_bias", default_bias));
  LAMINA_ASSIGN_OR_RETURN(bool mlp_bias, reader.BoolOr("mlp_bias", false));
  if (mlp_bias) return reader.Error("mlp_bias", "is true; MLP biases are not supported");
  LAMINA_ASSIGN_OR_RETURN(out.rope, ParseRope(config, label));

  // Mistral uses sliding_window directly; Qwen2 only when use_sliding_window is true.
  LAMINA_ASSIGN_OR_RETURN(bool use_window, reader.BoolOr("use_sliding_window",
                                                         out.architecture != "Qwen2ForCausalLM"));
  if (use_window && reader.Has("sliding_window")) {
    LAMINA_ASSIGN_OR_RETURN(out.sliding_window, reader.PositiveInt("sliding_window"));
    if (out.sliding_window >= out.max_position_embeddings) out.sliding_window = 0;
  }
  if (out.architecture == "Qwen2ForCausalLM" && use_window && reader.Has("max_window_layers")) {
    LAMINA_ASSIGN_OR_RETURN(int64_t window_layers, reader.PositiveInt("max_window_layers"));
    if (window_layers < out.num_layers && out.sliding_window > 0) {
      return reader.Error("max_window_layers",
                          "mixes windowed and full-attention layers, which is not supported");
    }
  }

  LAMINA_ASSIGN_OR_RETURN(out.bos_token_ids, reader.TokenIds("bos_token_id"));
  LAMINA_ASSIGN_OR_RETURN(out.eos_token_ids, reader.TokenIds("eos_token_id"));
  for (int64_t id : out.bos_token_ids) {
    if (id >= out.vocab_size) return reader.Error("bos_token_id", "is outside the vocabulary");
  }
  for (int64_t id : out.eos_token_ids) {
    if (id >= out.vocab_size) return reader.Error("eos_token_id", "is outside the vocabulary");
  }
  return out;
}

absl::Status AddGenerationConfigEos(const std::string& json_text, const std::string& label, ModelConfig* config) {
  Json generation = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (generation.is_discarded() || !generation.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": not a JSON object"));
  }
  FieldReader reader(generation, label);
  LAMINA_ASSIGN_OR_RETURN(std::vector<int64_t> eos, reader.TokenIds("eos_token_id"));
  for (int64_t id : eos) {
    if (id >= config->vocab_size) return reader.Error("eos_token_id", "is outside the vocabulary");
    if (std::find(config->eos_token_ids.begin(), config->eos_token_ids.end(), id) == config->eos_token_ids.end()) {
      config->eos_token_ids.push_back(id);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open (is '", dir, "' a model folder?)"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  LAMINA_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(buffer.str(), path));
  const std::string generation_path = dir + "/generation_config.json";
  std::ifstream generation(generation_path);
  if (generation) {
    std::stringstream text;
    text << generation.rdbuf();
    LAMINA_RETURN_IF_ERROR(AddGenerationConfigEos(text.str(), generation_path, &config));
  }
  return config;
}

}  // namespace lamina
