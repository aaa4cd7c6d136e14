// Local attention on a GPU: a compute engine over its own pool on cuda:0 runs each decode step as
// one CUDA graph per batch bucket, attention included (LocalDeviceDecode), and stores prompts from
// the device. Teacher-forced against the golden logits within the fixtures' bf16 tolerance, and
// batched (padded buckets, a sequence continuing with several rows in one step) against the CPU
// engine. Skips with the reason where no GPU is present.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/cuda/device.h"
#include "compute_node/engine/device_engine.h"
#include "compute_node/local/local_pool.h"
#include "compute_node/local/placed_attention.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"

namespace lamina {
namespace {

using ::lamina::testing::GoldenTensors;
using ::lamina::testing::LoadGoldenJson;
using ::lamina::testing::ModelDir;
using ::lamina::testing::RelativeError;

// As compute_node/engine/cuda/cuda_slice_backend_test.cc: the demo model's checkpoint is bf16; the
// tiny models' float32 weights rounded to bf16 add their own error.
double ToleranceFor(const std::string& model) { return model == "lamina-demo-6m" ? 2e-2 : 1e-1; }

std::string Key(int prompt, const std::string& what) { return "prompt_" + std::to_string(prompt) + "." + what; }

// An engine on `device` over a pool of its own there.
struct Engine {
  std::unique_ptr<DeviceWeights> weights;
  std::unique_ptr<LocalPool> pool;
  std::unique_ptr<PlacedAttention> attention;
  std::unique_ptr<ComputeEngine> engine;

  Engine(const std::string& model, const DeviceSpec& device) {
    auto host = ModelWeights::Load(ModelDir(model));
    EXPECT_TRUE(host.ok()) << host.status();
    const ModelConfig c = (*host)->config;
    auto on_device = DeviceWeights::FromHost(device, std::move(*host));
    EXPECT_TRUE(on_device.ok()) << on_device.status();
    weights = std::move(*on_device);
    auto made = LocalPool::Create({c.num_layers, 4096, {c.num_q_heads, c.num_kv_heads, c.head_dim, c.sliding_window},
                                   device.is_cuda ? device.index : -1, device.is_cuda ? DType::kBF16 : DType::kF32});
    EXPECT_TRUE(made.ok()) << made.status();
    pool = std::move(*made);
    auto placed = PlacedAttention::Create(pool.get(), "local", nullptr);
    EXPECT_TRUE(placed.ok()) << placed.status();
    attention = std::move(*placed);
    auto e = weights->MakeEngine(attention.get());
    EXPECT_TRUE(e.ok()) << e.status();
    engine = std::move(*e);
  }
  int64_t free_slots() { return pool->With([](AttentionExecutor& e) { return e.num_free_slots(); }); }
};

class LocalAttentionCudaTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string reason = NoGpuReason();
    if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  }
};

TEST_P(LocalAttentionCudaTest, TeacherForcedLogitsWithinBf16Tolerance) {
  const std::string model = GetParam();
  Engine gpu(model, {true, 0});
  ASSERT_NE(gpu.attention->local_device_decode(), nullptr);
  GoldenTensors golden(model);
  const bool demo = model == "lamina-demo-6m";
  const int num_prompts = static_cast<int>(LoadGoldenJson(model)["prompts"].size());
  double worst = 0;
  for (int p = 0; p < num_prompts; ++p) {
    const std::vector<int32_t> ids = golden.Ids(Key(p, "ids"));
    const std::vector<int32_t> greedy = golden.Ids(Key(p, "greedy_ids"));
    const Tensor expected = golden.Float(Key(p, "greedy_logits"));
    Tensor logits;
    PrefillSequence prompt{p, ids};
    ASSERT_TRUE(gpu.engine->Prefill({&prompt, 1}, false, &logits).ok());
    // Demo: row s chose greedy[s] (row 0 from the prompt). Tiny: row s follows feeding greedy[s].
    for (int64_t s = 0; s < expected.dim(0); ++s) {
      if (demo && s > 0) {
        DecodeToken token{p, greedy[s - 1], static_cast<int32_t>(ids.size() + s - 1)};
        ASSERT_TRUE(gpu.engine->Decode({&token, 1}, &logits).ok());
      } else if (!demo) {
        DecodeToken token{p, greedy[s], static_cast<int32_t>(ids.size() + s)};
        ASSERT_TRUE(gpu.engine->Decode({&token, 1}, &logits).ok());
      }
      const double error = RelativeError(logits.row(0), expected.row(s), expected.dim(1));
      worst = std::max(worst, error);
      EXPECT_LT(error, ToleranceFor(model)) << model << " prompt " << p << " step " << s;
    }
    gpu.attention->Free(p);
  }
  EXPECT_EQ(gpu.free_slots(), 4096);
  std::printf("%s: largest relative logit error over the local pool %.4f (tolerance %.2f)\n", model.c_str(), worst,
              ToleranceFor(model));
}

TEST_P(LocalAttentionCudaTest, GraphedStepsOfEveryBucketEqualTheCpuEngine) {
  // Batches padded to buckets 1, 4, 8, 24 and 48, each stepped several times (the first step of a
  // bucket captures its graph, the others replay it), and a step in which one sequence continues
  // with three rows (its later rows attend over the earlier ones' k/v, stored in the same step).
  const std::string model = GetParam();
  Engine gpu(model, {true, 0});
  Engine cpu(model, {false, 0});
  const ModelConfig& c = gpu.weights->config();
  GoldenTensors golden(model);
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < 3; ++p) prompts.push_back(golden.Ids(Key(p, "ids")));
  SequenceId next_seq = 0;
  for (int batch_size : {1, 3, 6, 17, 40}) {
    std::vector<PrefillSequence> batch;
    for (int i = 0; i < batch_size; ++i) batch.push_back({next_seq + i, prompts[i % 3]});
    Tensor gpu_logits, cpu_logits;
    ASSERT_TRUE(gpu.engine->Prefill(batch, false, &gpu_logits).ok());
    ASSERT_TRUE(cpu.engine->Prefill(batch, false, &cpu_logits).ok());
    std::vector<int32_t> position(batch_size);
    for (int i = 0; i < batch_size; ++i) position[i] = static_cast<int32_t>(prompts[i % 3].size());
    for (int step = 0; step < 4; ++step) {
      std::vector<DecodeToken> tokens;
      for (int i = 0; i < batch_size; ++i) {
        tokens.push_back({next_seq + i, ArgMax(cpu_logits.row(i), c.vocab_size), position[i]++});
      }
      if (step == 3) {  // sequence 0 continues with two more rows
        for (int extra = 0; extra < 2; ++extra) tokens.push_back({next_seq, 5 + extra, position[0]++});
      }
      ASSERT_TRUE(gpu.engine->Decode(tokens, &gpu_logits).ok());
      ASSERT_TRUE(cpu.engine->Decode(tokens, &cpu_logits).ok());
      for (size_t r = 0; r < tokens.size(); ++r) {
        EXPECT_LT(RelativeError(gpu_logits.row(r), cpu_logits.row(r), c.vocab_size), ToleranceFor(model))
            << model << " batch " << batch_size << " step " << step << " row " << r;
      }
    }
    for (int i = 0; i < batch_size; ++i) {
      gpu.attention->Free(next_seq + i);
      cpu.attention->Free(next_seq + i);
    }
    next_seq += batch_size;
  }
  EXPECT_EQ(gpu.free_slots(), 4096);
}

INSTANTIATE_TEST_SUITE_P(Models, LocalAttentionCudaTest,
                         ::testing::Values("lamina-demo-6m", "tiny-llama2", "tiny-llama3"));

}  // namespace
}  // namespace lamina
