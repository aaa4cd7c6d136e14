// Broken model folders are refused with a message that names the file and what is wrong.
#include "compute_node/model/model_weights.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>

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

// A layer split's shares: node [0, 2) of the demo model's 6 layers, node [2, 4) and node [4, 6)
// (weight_share.h). Each holds exactly what its slices run, with the whole model's values.
TEST(ModelWeightsTest, ALayerSplitsShareHoldsWhatItsSlicesRunAndNothingElse) {
  auto whole = ModelWeights::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(whole.ok()) << whole.status();
  const ModelConfig& c = (*whole)->config;
  ASSERT_EQ(c.num_layers, 6);
  auto equal = [](const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && std::equal(a.data(), a.data() + a.size(), b.data());
  };
  for (const WeightShare share : {WeightShare{0, 2}, WeightShare{2, 4}, WeightShare{4, 6}}) {
    SCOPED_TRACE(::testing::Message() << "layers [" << share.first_layer << ", " << share.end_layer << ")");
    auto loaded = ModelWeights::Load(ModelDir("lamina-demo-6m"), share);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    std::unique_ptr<ModelWeights> drawn = ModelWeights::Random(c, 3, share);
    std::unique_ptr<ModelWeights> drawn_whole = ModelWeights::Random(c, 3);
    for (const auto& [part, from] : {std::pair{loaded->get(), whole->get()}, std::pair{drawn.get(), drawn_whole.get()}}) {
      for (int64_t l = 0; l < c.num_layers; ++l) {
        // Attention-in of layers (first, end] and of layer 0 on the first node; attention-out of [first, end).
        const bool in = (l == 0 && share.first_layer == 0) || (l > share.first_layer && l <= share.end_layer);
        const bool out = l >= share.first_layer && l < share.end_layer;
        const LayerWeights& got = part->layers[l];
        const LayerWeights& want = from->layers[l];
        EXPECT_EQ(in, equal(got.qkv, want.qkv) && equal(got.input_norm, want.input_norm)) << "layer " << l;
        EXPECT_EQ(in, got.qkv.size() > 0) << "layer " << l;
        EXPECT_EQ(out, equal(got.o_proj, want.o_proj) && equal(got.gate_up, want.gate_up) &&
                           equal(got.down, want.down) && equal(got.post_norm, want.post_norm))
            << "layer " << l;
        EXPECT_EQ(out, got.down.size() > 0) << "layer " << l;
      }
      EXPECT_EQ(part->embed.size() > 0, share.first_layer == 0 || (c.tie_word_embeddings && share.end_layer == 6));
      EXPECT_EQ(part->final_norm.size() > 0, share.end_layer == 6);
      if (share.end_layer == 6) EXPECT_TRUE(equal(part->head(), from->head()));
    }
  }
}

TEST(ModelWeightsTest, RandomWeightsHaveTheShapeAndAreFixedByTheSeed) {
  auto demo = ModelWeights::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(demo.ok()) << demo.status();
  const ModelConfig& c = (*demo)->config;
  std::unique_ptr<ModelWeights> a = ModelWeights::Random(c, 7);
  std::unique_ptr<ModelWeights> again = ModelWeights::Random(c, 7);
  std::unique_ptr<ModelWeights> other = ModelWeights::Random(c, 8);
  ASSERT_EQ(a->layers.size(), (*demo)->layers.size());
  EXPECT_EQ(a->embed.shape(), (*demo)->embed.shape());
  EXPECT_EQ(a->head().shape(), (*demo)->head().shape());
  for (size_t l = 0; l < a->layers.size(); ++l) {
    EXPECT_EQ(a->layers[l].qkv.shape(), (*demo)->layers[l].qkv.shape());
    EXPECT_EQ(a->layers[l].o_proj.shape(), (*demo)->layers[l].o_proj.shape());
    EXPECT_EQ(a->layers[l].gate_up.shape(), (*demo)->layers[l].gate_up.shape());
    EXPECT_EQ(a->layers[l].down.shape(), (*demo)->layers[l].down.shape());
  }
  // The same seed gives the same values; another seed others.
  const Tensor& qkv = a->layers[3].qkv;
  EXPECT_EQ(std::vector<float>(qkv.data(), qkv.data() + qkv.size()),
            std::vector<float>(again->layers[3].qkv.data(), again->layers[3].qkv.data() + qkv.size()));
  EXPECT_NE(qkv.data()[0], other->layers[3].qkv.data()[0]);
  // Uniform in [-1/sqrt(hidden), 1/sqrt(hidden)]: bounded, centred, spread over the range.
  const float scale = 1.f / std::sqrt(static_cast<float>(c.hidden_size));
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < qkv.size(); ++i) {
    ASSERT_LE(std::fabs(qkv.data()[i]), scale);
    sum += qkv.data()[i];
    sum_sq += static_cast<double>(qkv.data()[i]) * qkv.data()[i];
  }
  EXPECT_NEAR(sum / qkv.size(), 0.0, 0.01 * scale);
  EXPECT_NEAR(std::sqrt(sum_sq / qkv.size()), scale / std::sqrt(3.0), 0.01 * scale);  // uniform's RMS
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
