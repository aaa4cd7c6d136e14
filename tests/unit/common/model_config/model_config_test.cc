#include "common/model_config/model_config.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/support/golden.h"

namespace lamina {
namespace {

std::string Config(const std::string& extra, const std::string& architecture = "LlamaForCausalLM") {
  return R"({"architectures": [")" + architecture + R"("], "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8,
    "max_position_embeddings": 256)" + extra + "}";
}

TEST(ModelConfigTest, ReadsTransformers4AndTransformers5Layouts) {
  auto llama2 = LoadModelConfig(testing::ModelDir("tiny-llama2"));
  ASSERT_TRUE(llama2.ok()) << llama2.status();
  EXPECT_EQ(llama2->num_kv_heads, 6);
  EXPECT_EQ(llama2->head_dim, 16);
  EXPECT_EQ(llama2->rope.theta, 10000.0);
  EXPECT_EQ(llama2->rms_norm_eps, 1e-6);
  auto llama3 = LoadModelConfig(testing::ModelDir("tiny-llama3"));
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  EXPECT_EQ(llama3->num_kv_heads, 2);
  EXPECT_EQ(llama3->rope.theta, 500000.0);
  EXPECT_EQ(llama3->bos_token_ids, (std::vector<int64_t>{509}));
}

TEST(ModelConfigTest, SizesPastAnyModelsAreRefusedNamingTheField) {
  auto layers = ParseModelConfig(Config("").replace(Config("").find("\"num_hidden_layers\": 2"), 22,
                                                    "\"num_hidden_layers\": 1000000000"),
                                 "config.json");
  EXPECT_EQ(layers.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(layers.status().message().find("num_hidden_layers' is 1000000000; at most 1024"), std::string::npos)
      << layers.status();
  auto vocab = ParseModelConfig(Config("").replace(Config("").find("\"vocab_size\": 100"), 17,
                                                   "\"vocab_size\": 99999999999"),
                                "config.json");
  EXPECT_NE(vocab.status().message().find("vocab_size' is 99999999999"), std::string::npos) << vocab.status();
}

TEST(ModelConfigTest, DerivesHeadDimAndDefaultsKvHeadsToMha) {
  auto c = ParseModelConfig(Config(""), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_FALSE(c->tie_word_embeddings);
}

TEST(ModelConfigTest, ExplicitHeadDimMqaTiedEmbeddingsAndEosList) {
  auto c = ParseModelConfig(Config(R"(, "head_dim": 16, "num_key_value_heads": 1, "tie_word_embeddings": true,
                                      "eos_token_id": [7, 9], "bos_token_id": 1)"), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_kv_heads, 1);
  EXPECT_EQ(c->q_size(), 128);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{7, 9}));
}

// Llama 3 instruct models end a turn with <|eot_id|>, which only generation_config.json may list.
TEST(ModelConfigTest, GenerationConfigsEosIdsJoinConfigsOnce) {
  auto c = ParseModelConfig(Config(R"(, "eos_token_id": 7)"), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(
      AddGenerationConfigEos(R"({"eos_token_id": [7, 9, 12], "do_sample": true})", "generation_config.json", &*c).ok());
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{7, 9, 12}));
  ASSERT_TRUE(AddGenerationConfigEos(R"({"temperature": 0.6})", "generation_config.json", &*c).ok());
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{7, 9, 12}));

  absl::Status outside = AddGenerationConfigEos(R"({"eos_token_id": 100})", "m/generation_config.json", &*c);
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(outside.message().find("m/generation_config.json"), absl::string_view::npos) << outside;
  EXPECT_NE(outside.message().find("eos_token_id"), absl::string_view::npos) << outside;
  EXPECT_FALSE(AddGenerationConfigEos("[1]", "generation_config.json", &*c).ok());
}

// The checkpoint's dtype, as transformers 5 ("dtype") or 4 ("torch_dtype") writes it; empty when
// neither is given.
TEST(ModelConfigTest, ReadsTheCheckpointsDtypeInBothLayouts) {
  auto demo = LoadModelConfig(testing::ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ(demo->dtype, "bfloat16");
  auto llama2 = LoadModelConfig(testing::ModelDir("tiny-llama2"));
  ASSERT_TRUE(llama2.ok()) << llama2.status();
  EXPECT_EQ(llama2->dtype, "float32");
  auto both = ParseModelConfig(Config(R"(, "dtype": "bfloat16", "torch_dtype": "float16")"), "config.json");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->dtype, "bfloat16");
  auto none = ParseModelConfig(Config(R"(, "torch_dtype": null)"), "config.json");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->dtype, "");
}

TEST(ModelConfigTest, Llama3RopeScalingInBothLayouts) {
  const std::string scaling = R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192)";
  auto v4 = ParseModelConfig(Config(R"(, "rope_theta": 500000.0, "rope_scaling": )" + scaling + "}"), "config.json");
  auto v5 = ParseModelConfig(Config(R"(, "rope_parameters": )" + scaling + R"(, "rope_theta": 500000.0})"), "config.json");
  for (const auto& c : {v4, v5}) {
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->rope.type, RopeConfig::Type::kLlama3);
    EXPECT_EQ(c->rope.theta, 500000.0);
    EXPECT_EQ(c->rope.factor, 8.0);
    EXPECT_EQ(c->rope.original_max_position_embeddings, 8192);
  }
}

TEST(ModelConfigTest, Qwen2HasAttentionBiasAndMistralSlidingWindow) {
  auto qwen = ParseModelConfig(Config(R"(, "use_sliding_window": false, "sliding_window": 64)", "Qwen2ForCausalLM"), "c");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_TRUE(qwen->attention_bias);
  EXPECT_EQ(qwen->sliding_window, 0);
  auto mistral = ParseModelConfig(Config(R"(, "sliding_window": 64)", "MistralForCausalLM"), "c");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_FALSE(mistral->attention_bias);
  EXPECT_EQ(mistral->sliding_window, 64);
}

TEST(ModelConfigTest, ErrorsNameTheFileAndTheField) {
  struct Case {
    std::string json;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"{", "not valid JSON"},
      {Config("", "GPT2LMHeadModel"), "'architectures' names 'GPT2LMHeadModel', which Lamina does not support"},
      {R"({"architectures": ["LlamaForCausalLM"]})", "'vocab_size' is missing"},
      {Config(R"(, "num_key_value_heads": 3)"), "'num_key_value_heads' (3) must divide"},
      {Config(R"(, "hidden_act": "gelu")"), "'hidden_act'"},
      {Config(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4})"), "'rope_type' 'yarn' is not supported"},
      {Config(R"(, "rms_norm_eps": "small")"), "'rms_norm_eps' must be a positive number"},
      {Config(R"(, "eos_token_id": [1, "x"])"), "'eos_token_id'"},
      {Config(R"(, "bos_token_id": 1000)"), "'bos_token_id' is outside the vocabulary"},
  };
  for (const Case& c : cases) {
    auto config = ParseModelConfig(c.json, "m/config.json");
    ASSERT_FALSE(config.ok()) << c.json;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(config.status().message().find("m/config.json"), std::string::npos) << config.status();
    EXPECT_NE(config.status().message().find(c.expected), std::string::npos) << config.status();
  }
}

}  // namespace
}  // namespace lamina
