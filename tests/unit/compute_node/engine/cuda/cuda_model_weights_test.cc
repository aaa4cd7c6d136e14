// Weights read from a checkpoint straight to the GPU are the bits the float32 host path uploads:
// a bf16 checkpoint (the demo model) and float32 ones (the tiny models, one with tied embeddings
// or not). Skips with the reason where no GPU is present.
#include "compute_node/engine/cuda/cuda_model_weights.h"

#include <cuda_runtime_api.h>

#include <string>
#include <utility>
#include <vector>

#include "common/cuda/device.h"
#include "compute_node/model/model_weights.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"

namespace lamina {
namespace {

std::vector<uint8_t> Bytes(const cuda::DeviceBuffer& buffer) {
  std::vector<uint8_t> host(buffer.bytes());
  if (!host.empty()) {
    EXPECT_EQ(cudaMemcpy(host.data(), buffer.data(), host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return host;
}

void ExpectSame(const cuda::DeviceBuffer& loaded, const cuda::DeviceBuffer& uploaded, const std::string& what) {
  EXPECT_EQ(loaded.bytes(), uploaded.bytes()) << what;
  EXPECT_TRUE(Bytes(loaded) == Bytes(uploaded)) << what << " differs";
}

class CudaModelWeightsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModelWeightsTest, LoadingStraightToTheGpuGivesTheBitsOfTheHostPath) {
  if (const std::string why = NoGpuReason(); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(UseDevice({true, 0}).ok());
  const std::string dir = testing::ModelDir(GetParam());
  absl::StatusOr<std::unique_ptr<CudaModelWeights>> loaded = CudaModelWeights::Load(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::StatusOr<std::unique_ptr<ModelWeights>> host = ModelWeights::Load(dir);
  ASSERT_TRUE(host.ok()) << host.status();
  absl::StatusOr<std::unique_ptr<CudaModelWeights>> uploaded = CudaModelWeights::Upload(**host);
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  const CudaModelWeights& a = **loaded;
  const CudaModelWeights& b = **uploaded;
  ExpectSame(a.embed, b.embed, "embed");
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const std::string layer = "layer " + std::to_string(i);
    ExpectSame(a.layers[i].input_norm, b.layers[i].input_norm, layer + " input_norm");
    ExpectSame(a.layers[i].qkv, b.layers[i].qkv, layer + " qkv");
    ExpectSame(a.layers[i].qkv_bias, b.layers[i].qkv_bias, layer + " qkv_bias");
    ExpectSame(a.layers[i].o_proj, b.layers[i].o_proj, layer + " o_proj");
    ExpectSame(a.layers[i].post_norm, b.layers[i].post_norm, layer + " post_norm");
    ExpectSame(a.layers[i].gate_up, b.layers[i].gate_up, layer + " gate_up");
    ExpectSame(a.layers[i].down, b.layers[i].down, layer + " down");
  }
  ExpectSame(a.final_norm, b.final_norm, "final_norm");
  ExpectSame(a.lm_head, b.lm_head, "lm_head");
  ExpectSame(a.rope, b.rope, "rope");
}

INSTANTIATE_TEST_SUITE_P(Models, CudaModelWeightsTest, ::testing::Values("lamina-demo-6m", "tiny-llama2", "tiny-llama3"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) ch = ch == '-' ? '_' : ch;
                           return name;
                         });

// A layer split's share on the GPU (weight_share.h): read from the checkpoint or drawn at random,
// it holds exactly its tensors, with the whole model's bits, and leaves the others empty.
TEST(CudaModelWeightsLoadTest, ALayerSplitsShareHoldsItsTensorsWithTheWholeModelsBits) {
  if (const std::string why = NoGpuReason(); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(UseDevice({true, 0}).ok());
  const std::string dir = testing::ModelDir("lamina-demo-6m");
  absl::StatusOr<std::unique_ptr<CudaModelWeights>> whole = CudaModelWeights::Load(dir);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const ModelConfig& c = (*whole)->config;
  absl::StatusOr<std::unique_ptr<CudaModelWeights>> drawn_whole = CudaModelWeights::Random(c, 9);
  ASSERT_TRUE(drawn_whole.ok()) << drawn_whole.status();
  for (const WeightShare share : {WeightShare{0, 2}, WeightShare{2, 6}}) {
    SCOPED_TRACE(::testing::Message() << "layers [" << share.first_layer << ", " << share.end_layer << ")");
    absl::StatusOr<std::unique_ptr<CudaModelWeights>> loaded = CudaModelWeights::Load(dir, share);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    absl::StatusOr<std::unique_ptr<CudaModelWeights>> drawn = CudaModelWeights::Random(c, 9, share);
    ASSERT_TRUE(drawn.ok()) << drawn.status();
    for (const auto& [part, from] : {std::pair{loaded->get(), whole->get()}, std::pair{drawn->get(), drawn_whole->get()}}) {
      for (int64_t l = 0; l < c.num_layers; ++l) {
        const std::string layer = "layer " + std::to_string(l);
        const CudaLayerWeights& got = part->layers[l];
        const CudaLayerWeights& want = from->layers[l];
        if (share.HoldsAttentionIn(c, l)) {
          ExpectSame(got.qkv, want.qkv, layer + " qkv");
          ExpectSame(got.input_norm, want.input_norm, layer + " input_norm");
        } else {
          EXPECT_EQ(got.qkv.bytes(), 0u) << layer;
        }
        if (share.HoldsAttentionOut(c, l)) {
          ExpectSame(got.o_proj, want.o_proj, layer + " o_proj");
          ExpectSame(got.down, want.down, layer + " down");
        } else {
          EXPECT_EQ(got.down.bytes(), 0u) << layer;
        }
      }
      EXPECT_EQ(part->embed.bytes() > 0, share.first_layer == 0);
      EXPECT_EQ(part->lm_head.bytes() > 0, share.end_layer == c.num_layers);
      if (share.end_layer == c.num_layers) ExpectSame(part->lm_head, from->lm_head, "lm_head");
      EXPECT_LT(part->StepBytes(), from->StepBytes());
    }
  }
}

TEST(CudaModelWeightsLoadTest, AMissingTensorIsNamed) {
  if (const std::string why = NoGpuReason(); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(UseDevice({true, 0}).ok());
  absl::StatusOr<std::unique_ptr<CudaModelWeights>> loaded = CudaModelWeights::Load("/nonexistent/model");
  EXPECT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("/nonexistent/model"), std::string::npos) << loaded.status();
}

}  // namespace
}  // namespace lamina
