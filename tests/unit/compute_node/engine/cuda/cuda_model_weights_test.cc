// Weights read from a checkpoint straight to the GPU are the bits the float32 host path uploads:
// a bf16 checkpoint (the demo model) and float32 ones (the tiny models, one with tied embeddings
// or not). Skips with the reason where no GPU is present.
#include "compute_node/engine/cuda/cuda_model_weights.h"

#include <cuda_runtime_api.h>

#include <string>
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

TEST(CudaModelWeightsLoadTest, AMissingTensorIsNamed) {
  if (const std::string why = NoGpuReason(); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(UseDevice({true, 0}).ok());
  absl::StatusOr<std::unique_ptr<CudaModelWeights>> loaded = CudaModelWeights::Load("/nonexistent/model");
  EXPECT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("/nonexistent/model"), std::string::npos) << loaded.status();
}

}  // namespace
}  // namespace lamina
