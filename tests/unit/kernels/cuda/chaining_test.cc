// Kernel chaining (kernels/cuda/chaining.h): a decode step's kernels, chained, give the same bits
// as one after the other. Each kernel of the chain reads what the one before wrote and writes what
// it read, so a kernel that touched its inputs before its wait would read stale values. Skips with
// the reason where no GPU is present.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/device.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/graph.h"
#include "common/status/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/chaining.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/small_batch_gemm.h"
#include "tests/support/cuda_test_util.h"

namespace lamina::kernels::cuda {
namespace {

using ::lamina::cuda::DeviceBuffer;
using ::lamina::testing::Download;
using ::lamina::testing::Upload;

// A one-token decode step of a small LLaMA-shaped model, every layer with the same weights, its
// attention under the planner's pick or `attention_plan` when given.
class ChainedStep {
 public:
  static constexpr int64_t kHidden = 1024, kHeads = 8, kKvHeads = 2, kDim = 128, kIntermediate = 2048;
  static constexpr int64_t kQ = kHeads * kDim, kKv = kKvHeads * kDim, kQkv = kQ + 2 * kKv;
  static constexpr int64_t kContext = 700, kLayers = 6, kVocab = 5000;

  explicit ChainedStep(std::mt19937* rng, const DecodePlan* attention_plan = nullptr) {
    auto random = [rng](int64_t n, float scale) {
      std::uniform_real_distribution<float> dist(-scale, scale);
      std::vector<bf16> v(n);
      for (bf16& x : v) x = __float2bfloat16(dist(*rng));
      return v;
    };
    norm_ = Upload(std::vector<bf16>(kHidden, __float2bfloat16(1.f)));
    qkv_w_ = Upload(random(kQkv * kHidden, 0.05f));
    o_w_ = Upload(random(kHidden * kQ, 0.03f));
    gate_up_w_ = Upload(random(2 * kIntermediate * kHidden, 0.05f));
    down_w_ = Upload(random(kHidden * kIntermediate, 0.03f));
    head_w_ = Upload(random(kVocab * kHidden, 0.05f));
    caches_ = Upload(random(2 * kLayers * (kContext + 1) * kKv, 1.f));
    std::vector<int32_t> slots(kContext + 1);
    std::iota(slots.begin(), slots.end(), 0);
    slots_ = Upload(slots);
    begin_ = Upload(std::vector<int32_t>{0, static_cast<int32_t>(kContext + 1)});
    write_slot_ = Upload(std::vector<int32_t>{static_cast<int32_t>(kContext)});
    position_ = Upload(std::vector<int32_t>{static_cast<int32_t>(kContext)});
    std::vector<double> inv_freq(kDim / 2);
    for (int64_t i = 0; i < kDim / 2; ++i) inv_freq[i] = std::pow(10000.0, -2.0 * i / kDim);
    rope_ = Upload(RopeCosSin(inv_freq, kContext + 1));
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    for (float& x : residual_start_) x = dist(*rng);
    plan_ = attention_plan != nullptr ? *attention_plan : PlanDecode({kHeads, kKvHeads, kDim, 0}, 1, kContext + 1, 132);
    plan_.workspace_floats = kHeads * plan_.splits * (kDim + 1);
    work_ = *DeviceBuffer::Create(std::max<int64_t>(1, plan_.workspace_floats) * sizeof(float));
    params_ = Upload(std::vector<DeviceSamplingParams>{{0.9f, 40, 0.9f, 3, 11}});
  }

  // The first decode's inputs, copied into the buffers the step uses (a captured graph holds their
  // addresses): the residual stream and the KV caches as they were made.
  void Reset() {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(residual_.data(), residual_start_.data(), kHidden * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess)
        << "residual";
    ASSERT_EQ(cudaMemcpy(caches_now_.data(), caches_.data(), caches_.bytes(), cudaMemcpyDeviceToDevice), cudaSuccess)
        << "caches";
  }

  // Queues the step: every layer, the LM head and a draw.
  absl::Status Queue(cudaStream_t stream) {
    const AttentionShape shape{kHeads, kKvHeads, kDim, 0};
    float* x = residual_.as<float>();
    for (int64_t layer = 0; layer < kLayers; ++layer) {
      bf16* k = caches_now_.as<bf16>() + 2 * layer * (kContext + 1) * kKv;
      bf16* v = k + (kContext + 1) * kKv;
      LAMINA_RETURN_IF_ERROR(RmsNorm(x, nullptr, norm_.as<bf16>(), normed_.as<bf16>(), 1, kHidden, 1e-5f, stream));
      LAMINA_RETURN_IF_ERROR(
          SmallBatchGemm(normed_.as<bf16>(), qkv_w_.as<bf16>(), nullptr, qkv_.as<float>(), 1, kQkv, kHidden, false,
                         stream));
      LAMINA_RETURN_IF_ERROR(Rope(qkv_.as<float>(), position_.as<int32_t>(), rope_.as<float>(), 1, kHeads + kKvHeads,
                                  kDim, kQkv, stream));
      LAMINA_RETURN_IF_ERROR(StoreKv(qkv_.as<float>() + kQ, qkv_.as<float>() + kQ + kKv, kQkv,
                                     write_slot_.as<int32_t>(), k, v, 1, kKv, stream));
      LAMINA_RETURN_IF_ERROR(DecodeAttention(shape, plan_, qkv_.as<float>(), kQkv, k, v, slots_.as<int32_t>(),
                                             begin_.as<int32_t>(), attn_.as<float>(), kQ, 1, work_.as<float>(),
                                             stream));
      LAMINA_RETURN_IF_ERROR(ToBf16(attn_.as<float>(), normed_.as<bf16>(), kQ, stream));
      LAMINA_RETURN_IF_ERROR(
          SmallBatchGemm(normed_.as<bf16>(), o_w_.as<bf16>(), nullptr, x, 1, kHidden, kQ, true, stream));
      LAMINA_RETURN_IF_ERROR(RmsNorm(x, nullptr, norm_.as<bf16>(), normed_.as<bf16>(), 1, kHidden, 1e-5f, stream));
      LAMINA_RETURN_IF_ERROR(SmallBatchGemm(normed_.as<bf16>(), gate_up_w_.as<bf16>(), nullptr, gate_up_.as<float>(),
                                            1, 2 * kIntermediate, kHidden, false, stream));
      LAMINA_RETURN_IF_ERROR(SwiGlu(gate_up_.as<float>(), activated_.as<bf16>(), 1, kIntermediate, stream));
      LAMINA_RETURN_IF_ERROR(SmallBatchGemm(activated_.as<bf16>(), down_w_.as<bf16>(), nullptr, x, 1, kHidden,
                                            kIntermediate, true, stream));
    }
    LAMINA_RETURN_IF_ERROR(RmsNorm(x, nullptr, norm_.as<bf16>(), normed_.as<bf16>(), 1, kHidden, 1e-5f, stream));
    LAMINA_RETURN_IF_ERROR(SmallBatchGemm(normed_.as<bf16>(), head_w_.as<bf16>(), nullptr, logits_.as<float>(), 1,
                                          kVocab, kHidden, false, stream));
    return Sample(logits_.as<float>(), nullptr, params_.as<DeviceSamplingParams>(), token_.as<int32_t>(), 1, kVocab,
                  stream);
  }

  int splits() const { return plan_.splits; }
  std::vector<float> residual() const { return Download<float>(residual_, kHidden); }
  std::vector<float> logits() const { return Download<float>(logits_, kVocab); }
  int32_t token() const { return Download<int32_t>(token_, 1)[0]; }
  std::vector<bf16> caches() const { return Download<bf16>(caches_now_, caches_.bytes() / sizeof(bf16)); }

 private:
  DeviceBuffer norm_, qkv_w_, o_w_, gate_up_w_, down_w_, head_w_, caches_, slots_, begin_, write_slot_, position_,
      rope_, work_, params_;
  DeviceBuffer residual_ = *DeviceBuffer::Create(kHidden * sizeof(float));
  DeviceBuffer caches_now_ = *DeviceBuffer::Create(2 * kLayers * (kContext + 1) * kKv * sizeof(bf16));
  DeviceBuffer normed_ = *DeviceBuffer::Create(kQ * sizeof(bf16));
  DeviceBuffer qkv_ = *DeviceBuffer::Create(kQkv * sizeof(float));
  DeviceBuffer attn_ = *DeviceBuffer::Create(kQ * sizeof(float));
  DeviceBuffer gate_up_ = *DeviceBuffer::Create(2 * kIntermediate * sizeof(float));
  DeviceBuffer activated_ = *DeviceBuffer::Create(kIntermediate * sizeof(bf16));
  DeviceBuffer logits_ = *DeviceBuffer::Create(kVocab * sizeof(float));
  DeviceBuffer token_ = *DeviceBuffer::Create(sizeof(int32_t));
  std::vector<float> residual_start_ = std::vector<float>(kHidden);
  DecodePlan plan_;
};

class KernelChainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = NoGpuReason();
    if (!reason.empty()) GTEST_SKIP() << "kernel chaining needs a GPU: " << reason;
  }
  void TearDown() override { SetKernelChaining(true); }
};

// Runs `step` unchained, then chained (launched one by one, and as a graph twice over), and
// expects the same bits each time.
void ExpectChainingKeepsTheBits(ChainedStep& step) {
  auto stream = ::lamina::cuda::Stream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();

  SetKernelChaining(false);
  step.Reset();
  ASSERT_TRUE(step.Queue(stream->get()).ok());
  const std::vector<float> residual = step.residual(), logits = step.logits();
  const std::vector<bf16> caches = step.caches();
  const int32_t token = step.token();

  SetKernelChaining(true);
  for (bool graphed : {false, true}) {
    SCOPED_TRACE(graphed ? "chained, as one CUDA graph" : "chained, launched one by one");
    step.Reset();
    if (graphed) {
      absl::StatusOr<::lamina::cuda::Graph> graph =
          ::lamina::cuda::Graph::Capture(stream->get(), [&] { return step.Queue(stream->get()); });
      ASSERT_TRUE(graph.ok()) << graph.status();
      // Twice over the same inputs: a launch may not start before the one before it ends.
      ASSERT_TRUE(graph->Launch(stream->get()).ok());
      step.Reset();
      ASSERT_TRUE(graph->Launch(stream->get()).ok());
    } else {
      ASSERT_TRUE(step.Queue(stream->get()).ok());
    }
    EXPECT_EQ(step.residual(), residual);
    EXPECT_EQ(step.logits(), logits);
    EXPECT_EQ(step.token(), token);
    const std::vector<bf16> got = step.caches();
    ASSERT_EQ(got.size(), caches.size());
    EXPECT_EQ(std::memcmp(got.data(), caches.data(), got.size() * sizeof(bf16)), 0) << "KV caches differ";
  }
}

TEST_F(KernelChainingTest, AChainedDecodeStepGivesTheBitsOfOneRunKernelByKernel) {
  std::mt19937 rng(41);
  ChainedStep step(&rng);
  ASSERT_GT(step.splits(), 1) << "the attention's merge kernel is part of the chain";
  ExpectChainingKeepsTheBits(step);
}

// Tiled decode attention queues its first tiles before StoreKv, the kernel ahead of it, has
// written the new token, unless they hold it. 701 tokens in 3 splits of whole tiles: [0, 256) and
// [256, 512) start early at either depth; [512, 701), whose first 3 tiles hold the new token (700),
// does with shallow tiles only. In one split every tiled plan starts early. The CUDA-core kernel,
// which waits first, in the same plans.
TEST_F(KernelChainingTest, AttentionStartingBeforeStoreKvEndsKeepsTheBits) {
  for (int kind = 0; kind < 3; ++kind) {
    for (int splits : {1, 3}) {
      const char* kinds[] = {"CUDA cores", "shallow tiles", "deep tiles"};
      SCOPED_TRACE(std::string(kinds[kind]) + ", " + std::to_string(splits) + " splits");
      DecodePlan plan;
      const DecodeStrategy strategies[] = {DecodeStrategy::kBlockPerHead, DecodeStrategy::kTiled,
                                           DecodeStrategy::kDeepTiled};
      plan.strategy = strategies[kind];
      plan.splits = splits;
      std::mt19937 rng(43);
      ChainedStep step(&rng, &plan);
      ExpectChainingKeepsTheBits(step);
    }
  }
}

}  // namespace
}  // namespace lamina::kernels::cuda
