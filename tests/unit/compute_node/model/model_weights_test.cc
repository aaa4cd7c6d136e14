// Broken model folders are refused with a message that names the file and what is wrong.
#include "compute_node/model/model_weights.h"

#include <filesystem>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"
#include "tests/support/temp_dir.h"

namespace lamina {
namespace {

using ::lamina::testing::ModelDir;
using ::lamina::testing::ReadFileOrDie;
using ::lamina::testing::TempDir;

void ExpectLoadError(const TempDir& dir, absl::StatusCode code, const std::vector<std::string>& parts) {
  auto weights = ModelWeights::Load(dir.path());
  ASSERT_FALSE(weights.ok());
  EXPECT_EQ(weights.status().code(), code) << weights.status();
  for (const std::string& part : parts) {
    EXPECT_NE(weights.status().message().find(part), std::string::npos) << weights.status() << "\nmissing: " << part;
  }
}

TEST(ModelWeightsTest, LoadsTheDemoModelFromBf16) {
  auto weights = ModelWeights::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ((*weights)->layers.size(), 6u);
  EXPECT_EQ((*weights)->layers[0].qkv.shape(), (std::vector<int64_t>{256 + 2 * 128, 256}));
  EXPECT_EQ((*weights)->layers[0].gate_up.shape(), (std::vector<int64_t>{2 * 688, 256}));
}

TEST(ModelWeightsTest, TruncatedCheckpoint) {
  TempDir dir;
  dir.CopyFrom(ModelDir("lamina-demo-6m"));
  std::string bytes = ReadFileOrDie(dir.path() + "/model.safetensors");
  dir.Write("model.safetensors", bytes.substr(0, bytes.size() / 2));
  ExpectLoadError(dir, absl::StatusCode::kInvalidArgument, {dir.path() + "/model.safetensors", "past the end"});
}

TEST(ModelWeightsTest, CorruptedHeader) {
  TempDir dir;
  dir.CopyFrom(ModelDir("lamina-demo-6m"));
  std::string bytes = ReadFileOrDie(dir.path() + "/model.safetensors");
  bytes[8] = '#';
  dir.Write("model.safetensors", bytes);
  ExpectLoadError(dir, absl::StatusCode::kInvalidArgument, {"model.safetensors", "header is not valid JSON"});
}

TEST(ModelWeightsTest, MissingTensor) {
  TempDir dir;
  dir.CopyFrom(ModelDir("tiny-llama3"));
  std::string bytes = ReadFileOrDie(dir.path() + "/model.safetensors");
  // Rename the tensor in the header (same length keeps the offsets valid).
  const std::string from = "model.layers.2.mlp.up_proj.weight", to = "model.layers.2.mlp.XX_proj.weight";
  size_t pos = bytes.find(from);
  ASSERT_NE(pos, std::string::npos);
  bytes.replace(pos, from.size(), to);
  dir.Write("model.safetensors", bytes);
  ExpectLoadError(dir, absl::StatusCode::kNotFound, {"no tensor 'model.layers.2.mlp.up_proj.weight'"});
}

TEST(ModelWeightsTest, TensorOfTheWrongShape) {
  TempDir dir;
  dir.CopyFrom(ModelDir("tiny-llama3"));
  std::string config = ReadFileOrDie(dir.path() + "/config.json");
  size_t pos = config.find("\"intermediate_size\": 352");
  ASSERT_NE(pos, std::string::npos);
  config.replace(pos, 24, "\"intermediate_size\": 350");
  dir.Write("config.json", config);
  ExpectLoadError(dir, absl::StatusCode::kInvalidArgument,
                  {"model.safetensors", "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [352, 128], expected [350, 128]"});
}

TEST(ModelWeightsTest, UnknownArchitecture) {
  TempDir dir;
  dir.CopyFrom(ModelDir("tiny-llama3"));
  std::string config = ReadFileOrDie(dir.path() + "/config.json");
  config.replace(config.find("LlamaForCausalLM"), 16, "BertForMaskedLM");
  dir.Write("config.json", config);
  ExpectLoadError(dir, absl::StatusCode::kInvalidArgument, {dir.path() + "/config.json", "BertForMaskedLM"});
}

TEST(ModelWeightsTest, MalformedTokenizerJson) {
  TempDir dir;
  dir.CopyFrom(ModelDir("tiny-llama3"));
  std::string tokenizer = ReadFileOrDie(dir.path() + "/tokenizer.json");
  dir.Write("tokenizer.json", tokenizer.substr(0, tokenizer.size() / 3));
  auto loaded = Tokenizer::Load(dir.path());
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find(dir.path() + "/tokenizer.json: not valid JSON"), std::string::npos)
      << loaded.status();
}

}  // namespace
}  // namespace lamina
