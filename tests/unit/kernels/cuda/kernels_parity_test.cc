// Every CUDA kernel against its CPU reference (kernels/cpu) on fresh random inputs: odd sizes,
// MHA, GQA and MQA, head_dim 16 to 128, contexts from 1 to 8K. Inputs that the GPU keeps in bf16
// are rounded to bf16 before the CPU sees them, so the tolerances measure the kernels, not the
// storage format. Skips with the reason where no GPU is present.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "common/cuda/device.h"
#include "common/cuda/device_buffer.h"
#include "compute_node/sampling/sampler.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/sampling.h"
#include "tests/support/cuda_test_util.h"

namespace lamina::kernels {
namespace {

using ::lamina::cuda::DeviceBuffer;
using ::lamina::kernels::cuda::DecodeStrategy;
using ::lamina::testing::Download;
using ::lamina::testing::Upload;
using bf16 = __nv_bfloat16;

class CudaParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = NoGpuReason();
    if (!reason.empty()) GTEST_SKIP() << "CUDA parity needs a GPU: " << reason;
  }

  std::vector<float> Random(size_t n, float scale = 1.f) {
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng_);
    return v;
  }
  // Rounds to bf16 and back, as the GPU will store it.
  static std::vector<float> RoundBf16(std::vector<float> v) {
    for (float& x : v) x = __bfloat162float(__float2bfloat16(x));
    return v;
  }
  static std::vector<bf16> ToBf16(const std::vector<float>& v) {
    std::vector<bf16> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
    return out;
  }
  static std::vector<float> DownloadBf16(const DeviceBuffer& buffer, size_t n) {
    std::vector<bf16> raw = Download<bf16>(buffer, n);
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = __bfloat162float(raw[i]);
    return out;
  }
  // Largest |a - b| / (atol + rtol |b|) must stay <= 1.
  static void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, float atol, float rtol,
                         const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::abs(got[i] - want[i]) / (atol + rtol * std::abs(want[i]));
      if (!(err <= worst)) {
        worst = err;
        at = i;
      }
    }
    EXPECT_LE(worst, 1.0) << what << ": element " << at << " is " << got[at] << ", CPU says " << want[at];
  }

  std::mt19937 rng_{1234};
};

TEST_F(CudaParityTest, EmbeddingIsExact) {
  const int64_t vocab = 37, hidden = 100;
  const std::vector<float> table = RoundBf16(Random(vocab * hidden));
  const std::vector<int32_t> tokens = {5, 0, 36, 5, 17};
  std::vector<float> want(tokens.size() * hidden);
  cpu::Embedding(table.data(), tokens.data(), want.data(), tokens.size(), hidden);
  DeviceBuffer d_table = Upload(ToBf16(table)), d_tokens = Upload(tokens);
  DeviceBuffer d_out = *DeviceBuffer::Create(want.size() * sizeof(float));
  ASSERT_TRUE(cuda::Embedding(d_table.as<bf16>(), d_tokens.as<int32_t>(), d_out.as<float>(), tokens.size(), hidden,
                              nullptr).ok());
  EXPECT_EQ(Download<float>(d_out, want.size()), want);
}

TEST_F(CudaParityTest, RmsNormWithAndWithoutResidualAdd) {
  for (int64_t hidden : {96, 1000, 4096}) {
    const int64_t rows = 7;
    std::vector<float> x = Random(rows * hidden, 3.f);
    const std::vector<float> delta = Random(rows * hidden);
    const std::vector<float> weight = RoundBf16(Random(hidden));
    for (bool fused : {false, true}) {
      std::vector<float> cpu_x = x;
      if (fused) cpu::AddInPlace(cpu_x.data(), delta.data(), cpu_x.size());
      std::vector<float> want(rows * hidden);
      cpu::RmsNorm(cpu_x.data(), weight.data(), want.data(), rows, hidden, 1e-5f);
      DeviceBuffer d_x = Upload(x), d_delta = Upload(delta), d_w = Upload(ToBf16(weight));
      DeviceBuffer d_out = *DeviceBuffer::Create(want.size() * sizeof(bf16));
      ASSERT_TRUE(cuda::RmsNorm(d_x.as<float>(), fused ? d_delta.as<float>() : nullptr, d_w.as<bf16>(),
                                d_out.as<bf16>(), rows, hidden, 1e-5f, nullptr).ok());
      ExpectNear(DownloadBf16(d_out, want.size()), want, 1e-3f, 8e-3f, "rmsnorm output");
      ExpectNear(Download<float>(d_x, x.size()), cpu_x, 1e-6f, 1e-6f, "residual after the fused add");
    }
  }
}

TEST_F(CudaParityTest, SwiGlu) {
  const int64_t rows = 5, inter = 333;
  const std::vector<float> gate_up = Random(rows * 2 * inter, 4.f);
  std::vector<float> want(rows * inter);
  cpu::SwiGlu(gate_up.data(), want.data(), rows, inter);
  DeviceBuffer d_in = Upload(gate_up), d_out = *DeviceBuffer::Create(want.size() * sizeof(bf16));
  ASSERT_TRUE(cuda::SwiGlu(d_in.as<float>(), d_out.as<bf16>(), rows, inter, nullptr).ok());
  ExpectNear(DownloadBf16(d_out, want.size()), want, 1e-3f, 8e-3f, "swiglu");
}

TEST_F(CudaParityTest, RopeDefaultAndLlama3) {
  RopeConfig llama3;
  llama3.theta = 500000;
  llama3.type = RopeConfig::Type::kLlama3;
  llama3.factor = 8;
  llama3.low_freq_factor = 1;
  llama3.high_freq_factor = 4;
  llama3.original_max_position_embeddings = 8192;
  RopeConfig plain;
  plain.theta = 10000;
  for (const RopeConfig& config : {plain, llama3}) {
    for (int64_t head_dim : {64, 128}) {
      const int64_t rows = 9, heads = 6, stride = heads * head_dim + 40;
      cpu::Rope rope(config, head_dim);
      const std::vector<int32_t> positions = {0, 1, 2, 100, 4095, 8191, 8192, 20000, 131071};
      std::vector<float> x = Random(rows * stride, 2.f);
      std::vector<float> want = x;
      rope.Apply(want.data(), positions.data(), rows, heads, stride);
      DeviceBuffer d_x = Upload(x), d_pos = Upload(positions);
      DeviceBuffer d_table = Upload(cuda::RopeCosSin(rope.inv_freq(), 131072));
      ASSERT_TRUE(cuda::Rope(d_x.as<float>(), d_pos.as<int32_t>(), d_table.as<float>(), rows, heads, head_dim,
                             stride, nullptr).ok());
      ExpectNear(Download<float>(d_x, x.size()), want, 1e-5f, 1e-5f, "rope");
    }
  }
}

TEST_F(CudaParityTest, GemmWithBiasAndAccumulate) {
  auto gemm = cuda::Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  struct Shape { int64_t m, n, k; };
  // m ≤ 2 with k a multiple of 8 runs SmallBatchGemm; the rest (and k = 100) cuBLASLt.
  for (const Shape& s : {Shape{1, 131, 96}, Shape{2, 4099, 4096}, Shape{1, 257, 14336}, Shape{2, 100, 100},
                         Shape{7, 37, 264}, Shape{33, 1024, 512}, Shape{128, 384, 4096}}) {
    const std::vector<float> x = RoundBf16(Random(s.m * s.k)), w = RoundBf16(Random(s.n * s.k, 0.05f));
    const std::vector<float> bias = Random(s.n), initial = Random(s.m * s.n);
    std::vector<float> want(s.m * s.n);
    cpu::Matmul(x.data(), w.data(), bias.data(), want.data(), s.m, s.n, s.k);
    DeviceBuffer d_x = Upload(ToBf16(x)), d_w = Upload(ToBf16(w)), d_b = Upload(bias), d_out = Upload(initial);
    ASSERT_TRUE((*gemm)->Run(d_x.as<bf16>(), d_w.as<bf16>(), d_b.as<float>(), d_out.as<float>(), s.m, s.n, s.k,
                             false, nullptr).ok());
    ExpectNear(Download<float>(d_out, want.size()), want, 1e-4f, 1e-4f, "gemm with bias");
    // Accumulate: out = out + x·Wᵀ, the fused residual add.
    std::vector<float> plain(s.m * s.n), accumulated = initial;
    cpu::Matmul(x.data(), w.data(), nullptr, plain.data(), s.m, s.n, s.k);
    cpu::AddInPlace(accumulated.data(), plain.data(), accumulated.size());
    DeviceBuffer d_acc = Upload(initial);
    ASSERT_TRUE((*gemm)->Run(d_x.as<bf16>(), d_w.as<bf16>(), nullptr, d_acc.as<float>(), s.m, s.n, s.k, true,
                             nullptr).ok());
    ExpectNear(Download<float>(d_acc, want.size()), accumulated, 1e-4f, 1e-4f, "gemm accumulate");
  }
}

// A float32 x rounded on the way in: the bits of ToBf16 then Run, at the sizes SmallBatchGemm takes
// (one launch) and at those it leaves to cuBLASLt (through the scratch).
TEST_F(CudaParityTest, GemmRoundingXGivesTheBitsOfToBf16ThenGemm) {
  auto gemm = cuda::Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  for (const int64_t m : {1, 2, 5}) {
    SCOPED_TRACE(m);
    const int64_t n = 300, k = 4096;
    const std::vector<float> x = Random(m * k, 3.f), w = RoundBf16(Random(n * k, 0.05f)), initial = Random(m * n);
    DeviceBuffer d_x = Upload(x), d_w = Upload(ToBf16(w));
    DeviceBuffer d_scratch = *DeviceBuffer::Create(m * k * sizeof(bf16));
    DeviceBuffer d_rounded = *DeviceBuffer::Create(m * k * sizeof(bf16));
    DeviceBuffer d_want = Upload(initial), d_got = Upload(initial);
    ASSERT_TRUE(cuda::ToBf16(d_x.as<float>(), d_rounded.as<bf16>(), m * k, nullptr).ok());
    ASSERT_TRUE((*gemm)->Run(d_rounded.as<bf16>(), d_w.as<bf16>(), nullptr, d_want.as<float>(), m, n, k, true,
                             nullptr).ok());
    ASSERT_TRUE((*gemm)->RunRoundingX(d_x.as<float>(), d_scratch.as<bf16>(), d_w.as<bf16>(), nullptr,
                                      d_got.as<float>(), m, n, k, true, nullptr).ok());
    EXPECT_EQ(Download<float>(d_got, m * n), Download<float>(d_want, m * n));
  }
}

// After Prepare, products of the prepared shapes at any row count reuse the algorithms chosen
// for the powers of two (checked by cuBLASLt for the actual shape), so cuBLASLt is not asked again:
// asking may load kernels, which waits for the GPU to idle (gemm.h). The results still match.
TEST_F(CudaParityTest, PreparedGemmReusesItsAlgorithmsAtOtherRowCounts) {
  auto gemm = cuda::Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const int64_t n = 384, k = 4096;
  ASSERT_TRUE((*gemm)->Prepare({{n, k, true, false}, {n, k, false, true}}, 64).ok());
  const int64_t prepared = (*gemm)->algorithm_queries();
  EXPECT_EQ(prepared, 2 * 5);  // rows 4, 8, 16, 32 and 64, for each shape
  for (const int64_t m : {3, 7, 24, 33, 64, 100}) {
    SCOPED_TRACE(m);
    const std::vector<float> x = RoundBf16(Random(m * k)), w = RoundBf16(Random(n * k, 0.05f));
    const std::vector<float> bias = Random(n), initial = Random(m * n);
    std::vector<float> want(m * n), plain(m * n), accumulated = initial;
    cpu::Matmul(x.data(), w.data(), bias.data(), want.data(), m, n, k);
    cpu::Matmul(x.data(), w.data(), nullptr, plain.data(), m, n, k);
    cpu::AddInPlace(accumulated.data(), plain.data(), accumulated.size());
    DeviceBuffer d_x = Upload(ToBf16(x)), d_w = Upload(ToBf16(w)), d_b = Upload(bias);
    DeviceBuffer d_out = Upload(initial), d_acc = Upload(initial);
    ASSERT_TRUE((*gemm)->Run(d_x.as<bf16>(), d_w.as<bf16>(), d_b.as<float>(), d_out.as<float>(), m, n, k, false,
                             nullptr).ok());
    ASSERT_TRUE((*gemm)->Run(d_x.as<bf16>(), d_w.as<bf16>(), nullptr, d_acc.as<float>(), m, n, k, true, nullptr)
                    .ok());
    ExpectNear(Download<float>(d_out, want.size()), want, 1e-4f, 1e-4f, "prepared gemm with bias");
    ExpectNear(Download<float>(d_acc, want.size()), accumulated, 1e-4f, 1e-4f, "prepared gemm accumulate");
  }
  EXPECT_EQ((*gemm)->algorithm_queries(), prepared);
}

struct AttentionCase {
  int64_t q_heads, kv_heads, head_dim;
  std::vector<int64_t> contexts;  // one per sequence
  int64_t sliding_window = 0;
};

TEST_F(CudaParityTest, DecodeAttentionOverScatteredSlots) {
  const std::vector<AttentionCase> cases = {
      {8, 8, 64, {1, 17, 300}},                // MHA
      {32, 8, 128, {2048, 1, 4097, 33}},       // GQA, Llama-3 shape
      {8, 1, 128, {8192}},                     // MQA, 8K
      {6, 6, 16, {5, 70}},                     // the tiny model's shape
      {8, 4, 32, {257, 1000, 3}},              // the demo model's shape
      {12, 2, 64, {500, 129}, 100},            // 6 heads per KV head, sliding window
      {28, 4, 128, {1500}},                    // 7 heads per KV head
  };
  for (const AttentionCase& c : cases) {
    const cpu::AttentionShape shape{c.q_heads, c.kv_heads, c.head_dim, c.sliding_window};
    const int64_t seqs = static_cast<int64_t>(c.contexts.size());
    const int64_t total = std::accumulate(c.contexts.begin(), c.contexts.end(), int64_t{0});
    const int64_t num_slots = total + 50;
    const int64_t kv_size = c.kv_heads * c.head_dim, q_size = c.q_heads * c.head_dim;
    // Each sequence's positions land on scattered slots, as after churn in the allocator.
    std::vector<int32_t> slots(num_slots);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng_);
    slots.resize(total);
    std::vector<int64_t> begin64 = {0};
    std::vector<int32_t> begin32 = {0};
    for (int64_t len : c.contexts) {
      begin64.push_back(begin64.back() + len);
      begin32.push_back(static_cast<int32_t>(begin64.back()));
    }
    const std::vector<float> keys = RoundBf16(Random(num_slots * kv_size, 2.f));
    const std::vector<float> values = RoundBf16(Random(num_slots * kv_size));
    const int64_t q_stride = q_size + 24;
    const std::vector<float> q = Random(seqs * q_stride);
    std::vector<float> want(seqs * q_size);
    cpu::DecodeAttention(shape, q.data(), q_stride, keys.data(), values.data(), kv_size, slots.data(), begin64.data(),
                         want.data(), q_size, seqs);

    // The queries 16-byte aligned (read in vectors), and one float past that (read in scalars).
    std::vector<float> q_shifted = {0.f};
    q_shifted.insert(q_shifted.end(), q.begin(), q.end());
    DeviceBuffer d_q = Upload(q), d_q_shifted = Upload(q_shifted);
    DeviceBuffer d_k = Upload(ToBf16(keys)), d_v = Upload(ToBf16(values));
    DeviceBuffer d_slots = Upload(slots), d_begin = Upload(begin32);
    const int64_t longest = *std::max_element(c.contexts.begin(), c.contexts.end());
    // The planner's picks for a small and a large GPU, then a block (on the CUDA cores and tiled)
    // and a warp per (sequence, kv head) whatever the context, then the most splits a launch takes
    // (tiled, whole tiles: most of them left empty, which the merge must pass over); tiled ones
    // with deep tiles too.
    cuda::DecodePlan block_each, tiled_each, deep_each, warp_each, query_head_warps, most_splits, most_tiled_splits,
        most_deep_splits;
    tiled_each.strategy = DecodeStrategy::kTiled;
    deep_each.strategy = DecodeStrategy::kDeepTiled;
    warp_each.strategy = DecodeStrategy::kWarpPerHead;
    query_head_warps.strategy = DecodeStrategy::kWarpPerQueryHead;
    most_splits.splits = 1024;
    most_splits.workspace_floats = seqs * c.q_heads * most_splits.splits * (c.head_dim + 1);
    most_tiled_splits = most_splits;
    most_tiled_splits.strategy = DecodeStrategy::kTiled;
    most_deep_splits = most_tiled_splits;
    most_deep_splits.strategy = DecodeStrategy::kDeepTiled;
    std::vector<cuda::DecodePlan> plans = {cuda::PlanDecode(shape, seqs, longest, 1),
                                           cuda::PlanDecode(shape, seqs, longest, 132),
                                           block_each,
                                           tiled_each,
                                           deep_each,
                                           warp_each,
                                           most_splits,
                                           most_tiled_splits,
                                           most_deep_splits};
    if (cuda::QueryHeadWarpsServe(shape)) {
      for (int width : {1, 2, cuda::kMostPairsPerBlock}) {
        query_head_warps.pairs_per_block = width;
        plans.push_back(query_head_warps);
      }
    }
    for (const float* d_queries : {d_q.as<float>(), d_q_shifted.as<float>() + 1}) {
      for (const cuda::DecodePlan& plan : plans) {
        DeviceBuffer d_out = *DeviceBuffer::Create(want.size() * sizeof(float));
        DeviceBuffer d_work = *DeviceBuffer::Create(std::max<int64_t>(1, plan.workspace_floats) * sizeof(float));
        ASSERT_TRUE(cuda::DecodeAttention(shape, plan, d_queries, q_stride, d_k.as<bf16>(), d_v.as<bf16>(),
                                          d_slots.as<int32_t>(), d_begin.as<int32_t>(), d_out.as<float>(), q_size,
                                          seqs, d_work.as<float>(), nullptr).ok());
        ExpectNear(Download<float>(d_out, want.size()), want, 2e-4f, 2e-3f,
                   "decode attention, heads " + std::to_string(c.q_heads) + "/" + std::to_string(c.kv_heads) + " dim " +
                       std::to_string(c.head_dim) + " splits " + std::to_string(plan.splits) + " " +
                       cuda::DecodeStrategyName(plan.strategy) +
                       (plan.pairs_per_block > 1 ? ", pairs a block " + std::to_string(plan.pairs_per_block) : "") +
                       (d_queries == d_q.as<float>() ? "" : " queries not 16-byte aligned"));
      }
    }
  }
}

TEST(DecodePlanTest, AWarpPerHeadForShortContextsInOneSplit) {
  const cpu::AttentionShape llama{32, 8, 128, 0};
  // Batch 1024 at one token: one split, a warp per (sequence, kv head), four to a block.
  cuda::DecodePlan plan = cuda::PlanDecode(llama, 1024, 1, 132);
  EXPECT_EQ(plan.splits, 1);
  EXPECT_EQ(plan.strategy, DecodeStrategy::kWarpPerHead);
  EXPECT_EQ(cuda::DecodeBlocks(llama, plan, 1024), 1024 * 8 / 4);
  EXPECT_EQ(cuda::DecodeBlocks(llama, plan, 3), 6);  // 24 pairs, the last block full
  EXPECT_EQ(cuda::DecodeBlocks(llama, plan, 1), 2);
  // Fewer pairs than fill the GPU with blocks: a warp each only where the context is short for
  // them (at most 10 tokens for each pair per SM), and never below 2 pairs an SM.
  plan = cuda::PlanDecode(llama, 64, 1, 132);  // 512 pairs: up to 38 tokens
  EXPECT_EQ(plan.splits, 1);
  EXPECT_EQ(plan.strategy, DecodeStrategy::kWarpPerHead);
  EXPECT_EQ(cuda::PlanDecode(llama, 64, 38, 132).strategy, DecodeStrategy::kWarpPerHead);
  EXPECT_NE(cuda::PlanDecode(llama, 64, 39, 132).strategy, DecodeStrategy::kWarpPerHead);
  EXPECT_EQ(cuda::PlanDecode(llama, 128, 77, 132).strategy, DecodeStrategy::kWarpPerHead);  // 1024 pairs: up to 77 tokens
  EXPECT_NE(cuda::PlanDecode(llama, 128, 78, 132).strategy, DecodeStrategy::kWarpPerHead);
  EXPECT_NE(cuda::PlanDecode(llama, 32, 1, 132).strategy, DecodeStrategy::kWarpPerHead);  // 256 pairs: under 2 an SM
  // Past them, up to 256 tokens in one split, a block each on the CUDA cores; else tiles.
  plan = cuda::PlanDecode(llama, 64, 39, 132);
  EXPECT_NE(plan.strategy, DecodeStrategy::kWarpPerHead);
  EXPECT_FALSE(plan.tiled());
  EXPECT_EQ(plan.splits, 1);
  EXPECT_FALSE(cuda::PlanDecode(llama, 128, 256, 132).tiled());
  EXPECT_TRUE(cuda::PlanDecode(llama, 128, 257, 132).tiled());
  EXPECT_TRUE(cuda::PlanDecode(llama, 32, 128, 132).tiled());
  // Past 256 tokens, a block each.
  plan = cuda::PlanDecode(llama, 1024, 257, 132);
  EXPECT_NE(plan.strategy, DecodeStrategy::kWarpPerHead);
  EXPECT_EQ(cuda::DecodeBlocks(llama, plan, 1024), 1024 * 8);
  // Split contexts keep a block per split.
  plan = cuda::PlanDecode(llama, 1, 256, 132);
  EXPECT_EQ(plan.splits, 4);
  EXPECT_NE(plan.strategy, DecodeStrategy::kWarpPerHead);
  EXPECT_EQ(cuda::DecodeBlocks(llama, plan, 1), 8 * 4);
}

TEST(DecodePlanTest, AWarpPerQueryHeadServesEvenlySharedHeads) {
  for (int64_t group : {1, 2, 3, 4, 8}) {
    EXPECT_TRUE(cuda::QueryHeadWarpsServe({8 * group, 8, 128, 0})) << group << " query heads a kv head";
  }
  for (int64_t group : {5, 6, 7}) {
    EXPECT_FALSE(cuda::QueryHeadWarpsServe({8 * group, 8, 128, 0})) << group << " query heads a kv head";
  }
  EXPECT_FALSE(cuda::QueryHeadWarpsServe({12, 8, 128, 0}));  // not a multiple
  cuda::DecodePlan plan;
  plan.strategy = DecodeStrategy::kWarpPerQueryHead;
  const cpu::AttentionShape llama{32, 8, 128, 0};
  EXPECT_EQ(cuda::DecodeBlocks(llama, plan, 16), 16 * 8);  // a block a (sequence, kv head)
  plan.pairs_per_block = 2;
  EXPECT_EQ(cuda::DecodeBlocks(llama, plan, 16), 16 * 8 / 2);
  plan.pairs_per_block = cuda::kMostPairsPerBlock;
  EXPECT_EQ(cuda::DecodeBlocks(llama, plan, 32), 32 * 8 / 4);
  EXPECT_EQ(cuda::DecodeBlocks({4, 1, 128, 0}, plan, 5), 2);  // 5 pairs, the last block part-filled
}

TEST_F(CudaParityTest, PairsABlockAreOneOrAWarpPerQueryHeadsTwoOrFour) {
  const cpu::AttentionShape llama{32, 8, 128, 0};
  cuda::DecodePlan plan;
  plan.strategy = DecodeStrategy::kWarpPerQueryHead;
  plan.pairs_per_block = 3;
  absl::Status status = cuda::DecodeAttention(llama, plan, nullptr, 32 * 128, nullptr, nullptr, nullptr, nullptr,
                                              nullptr, 32 * 128, 1, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("3 pairs a block"), std::string::npos) << status.message();
  plan.strategy = DecodeStrategy::kWarpPerHead;
  plan.pairs_per_block = 2;
  status = cuda::DecodeAttention(llama, plan, nullptr, 32 * 128, nullptr, nullptr, nullptr, nullptr, nullptr,
                                 32 * 128, 1, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << "a warp per head takes 1";
}

TEST_F(CudaParityTest, AWarpPerQueryHeadRefusesHeadsTheWarpsCannotShareEvenly) {
  cuda::DecodePlan plan;
  plan.strategy = DecodeStrategy::kWarpPerQueryHead;
  const cpu::AttentionShape shape{12, 2, 64, 0};  // 6 query heads a kv head
  const absl::Status status = cuda::DecodeAttention(shape, plan, nullptr, 12 * 64, nullptr, nullptr, nullptr, nullptr,
                                                    nullptr, 12 * 64, 1, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("not 6"), std::string::npos) << status.message();
}

TEST(DecodePlanTest, PolledPacketsTakeAWarpPerHeadFromMorePairsThanHalfTheSms) {
  // 6 query heads a kv head, which a warp per query head does not serve.
  const cpu::AttentionShape uneven{48, 8, 128, 0};
  const auto polled = [&](int64_t seqs, int64_t context) {
    return cuda::PlanPolledDecode(uneven, cuda::PlanDecode(uneven, seqs, context, 132), seqs, context, 132);
  };
  // 16 rows at one token (128 pairs): PlanDecode's tiles, a warp each for packets.
  EXPECT_NE(cuda::PlanDecode(uneven, 16, 1, 132).strategy, DecodeStrategy::kWarpPerHead);
  cuda::DecodePlan plan = polled(16, 1);
  EXPECT_EQ(plan.strategy, DecodeStrategy::kWarpPerHead);
  EXPECT_NE(plan.strategy, DecodeStrategy::kWarpPerQueryHead);
  EXPECT_FALSE(plan.tiled());
  EXPECT_EQ(plan.splits, 1);
  EXPECT_EQ(plan.workspace_floats, 0);
  EXPECT_EQ(polled(9, 1).strategy, DecodeStrategy::kWarpPerHead);    // 72 pairs: more than 66
  EXPECT_NE(polled(8, 1).strategy, DecodeStrategy::kWarpPerHead);   // 64 pairs: the tiles
  // At most 4 tokens for each pair an SM.
  EXPECT_EQ(polled(32, 7).strategy, DecodeStrategy::kWarpPerHead);  // 256 pairs: up to 7 tokens
  EXPECT_NE(polled(32, 8).strategy, DecodeStrategy::kWarpPerHead);
  EXPECT_EQ(polled(16, 3).strategy, DecodeStrategy::kWarpPerHead);  // 128 pairs: up to 3
  EXPECT_NE(polled(16, 4).strategy, DecodeStrategy::kWarpPerHead);
  // Split contexts, and plans already a warp each, stay as they are.
  EXPECT_EQ(polled(1, 256).splits, 4);
  EXPECT_EQ(polled(64, 1).strategy, DecodeStrategy::kWarpPerHead);
  EXPECT_NE(polled(64, 39).strategy, DecodeStrategy::kWarpPerHead);  // PlanDecode's CUDA-core blocks
  EXPECT_FALSE(polled(64, 39).tiled());
}

TEST(DecodePlanTest, PolledPacketsTakeAWarpPerQueryHeadAtShortContexts) {
  const cpu::AttentionShape llama{32, 8, 128, 0};
  const auto polled = [&](int64_t seqs, int64_t context) {
    return cuda::PlanPolledDecode(llama, cuda::PlanDecode(llama, seqs, context, 132), seqs, context, 132);
  };
  // Up to 16 tokens and 8 pairs an SM (1056 of 132 SMs), whatever the pick before.
  for (const int64_t seqs : {1, 8, 16, 32, 66, 132}) {
    for (const int64_t context : {1, 16}) {
      const cuda::DecodePlan plan = polled(seqs, context);
      EXPECT_EQ(plan.strategy, DecodeStrategy::kWarpPerQueryHead) << seqs << " rows, context " << context;
      EXPECT_FALSE(plan.strategy == DecodeStrategy::kWarpPerHead || plan.tiled());
      EXPECT_EQ(plan.splits, 1);
      EXPECT_EQ(plan.workspace_floats, 0);
      EXPECT_EQ(cuda::DecodeBlocks(llama, plan, seqs), seqs * 8);
    }
  }
  // Past 16 tokens only where the pick was a warp per pair: 64 rows (512 pairs) up to 38 tokens.
  EXPECT_TRUE(polled(16, 17).tiled());
  EXPECT_EQ(cuda::PlanDecode(llama, 64, 38, 132).strategy, DecodeStrategy::kWarpPerHead);
  EXPECT_EQ(polled(64, 38).strategy, DecodeStrategy::kWarpPerQueryHead);
  EXPECT_NE(polled(64, 39).strategy, DecodeStrategy::kWarpPerQueryHead);  // PlanDecode's CUDA-core blocks
  EXPECT_FALSE(polled(64, 39).tiled());
  // Past 8 pairs an SM, a warp per pair.
  EXPECT_EQ(polled(133, 1).strategy, DecodeStrategy::kWarpPerHead);  // 1064 pairs
  EXPECT_EQ(polled(1024, 1).strategy, DecodeStrategy::kWarpPerHead);
  // Split contexts stay as they are.
  EXPECT_EQ(polled(1, 256).splits, 4);
  // On a share of the GPU (a memory node's chunks side by side), its SMs count.
  EXPECT_EQ(cuda::PlanPolledDecode(llama, cuda::PlanDecode(llama, 16, 1, 33), 16, 1, 33).strategy,
            DecodeStrategy::kWarpPerQueryHead);
  EXPECT_EQ(cuda::PlanPolledDecode(llama, cuda::PlanDecode(llama, 33, 1, 33), 33, 1, 33).strategy,
            DecodeStrategy::kWarpPerQueryHead);
  EXPECT_NE(cuda::PlanPolledDecode(llama, cuda::PlanDecode(llama, 34, 1, 33), 34, 1, 33).strategy,
            DecodeStrategy::kWarpPerQueryHead);
}

TEST(DecodePlanTest, TiledSplitsFillTheBlocksTheGpuHoldsAtOnce) {
  const cpu::AttentionShape gqa{32, 8, 128, 0};
  // Shallow tiles (deep ones not fitting), 132 SMs of 2 blocks: batch 16 (128 pairs) in 2 splits
  // of 16 tiles, one wave of 256 blocks, rather than 3 splits in two waves.
  cuda::DecodePlan plan = cuda::PlanDecode(gqa, 16, 2048, 132, 2, /*deep_tiles_fit=*/false);
  EXPECT_TRUE(plan.tiled());
  EXPECT_NE(plan.strategy, DecodeStrategy::kDeepTiled);
  EXPECT_EQ(plan.splits, 2);
  EXPECT_EQ(plan.workspace_floats, 16 * 32 * 2 * 129);
  // 512 pairs already take two waves: more splits would only add waves.
  EXPECT_EQ(cuda::PlanDecode(gqa, 64, 2048, 132, 2).splits, 1);
  EXPECT_NE(cuda::PlanDecode(gqa, 64, 2048, 132, 2).strategy, DecodeStrategy::kDeepTiled);
  EXPECT_EQ(cuda::PlanDecode(gqa, 128, 4096, 132, 2).splits, 1);
  // 64 pairs: 4 splits of 16 tiles in one wave.
  EXPECT_TRUE(cuda::PlanDecode(gqa, 8, 4096, 132, 2, false).tiled());
  EXPECT_EQ(cuda::PlanDecode(gqa, 8, 4096, 132, 2, false).splits, 4);
  // Twice the blocks an SM holds, twice the splits.
  EXPECT_EQ(cuda::PlanDecode(gqa, 16, 2048, 132, 4, false).splits, 4);
}

TEST(DecodePlanTest, DeepTilesForAtMostAPairAnSm) {
  const cpu::AttentionShape gqa{32, 8, 128, 0};
  // Batch 16: 128 pairs on 132 SMs, a block each in one split (two splits would take two waves).
  cuda::DecodePlan plan = cuda::PlanDecode(gqa, 16, 2048, 132, 2);
  EXPECT_TRUE(plan.tiled());
  EXPECT_EQ(plan.strategy, DecodeStrategy::kDeepTiled);
  EXPECT_EQ(plan.splits, 1);
  EXPECT_EQ(plan.workspace_floats, 0);
  // Batch 8: 64 pairs in 2 splits, 128 blocks.
  plan = cuda::PlanDecode(gqa, 8, 4096, 132, 2);
  EXPECT_EQ(plan.strategy, DecodeStrategy::kDeepTiled);
  EXPECT_EQ(plan.splits, 2);
  // 136 pairs outnumber the SMs: shallow tiles, two blocks an SM.
  plan = cuda::PlanDecode(gqa, 17, 2048, 132, 2);
  EXPECT_TRUE(plan.tiled());
  EXPECT_NE(plan.strategy, DecodeStrategy::kDeepTiled);
}

TEST(DecodePlanTest, SmallBatchesSplitIntoDeepTiles) {
  const cpu::AttentionShape gqa{32, 8, 128, 0}, mha{32, 32, 128, 0}, mqa{32, 1, 128, 0};
  // Batch 1 of GQA at 4096 tokens: 8 pairs in 16 deep splits of 4 tiles, 128 blocks.
  cuda::DecodePlan plan = cuda::PlanDecode(gqa, 1, 4096, 132, 2);
  EXPECT_TRUE(plan.tiled());
  EXPECT_EQ(plan.strategy, DecodeStrategy::kDeepTiled);
  EXPECT_EQ(plan.splits, 16);
  EXPECT_EQ(plan.workspace_floats, 32 * 16 * 129);
  // GQA batch 4 and MHA batch 1, 32 pairs: 4 deep splits.
  for (const cuda::DecodePlan& p : {cuda::PlanDecode(gqa, 4, 4096, 132, 2), cuda::PlanDecode(mha, 1, 4096, 132, 2)}) {
    EXPECT_EQ(p.strategy, DecodeStrategy::kDeepTiled);
    EXPECT_EQ(p.splits, 4);
  }
  // One pair: a split a tile, no more (64 tiles).
  EXPECT_EQ(cuda::PlanDecode(mqa, 1, 4096, 132, 2).splits, 64);
  // A short context: one tile, one split, no workspace.
  plan = cuda::PlanDecode(gqa, 1, 40, 132, 2);
  EXPECT_EQ(plan.splits, 1);
  EXPECT_EQ(plan.workspace_floats, 0);
}

// Shallow tiles take half an SM's shared memory, so that two blocks of 128 threads share an SM
// (a third, which the registers allow, read large batches slower). The kernels' own static shared
// memory must count against that half: a byte more leaves one block an SM. It did for the linked
// launch (its polled query heads), which then read large batches at 0.73-0.80 of the read rate
// rather than 0.89-0.97 on an H100, 0.55-0.61 rather than 0.79-0.86 on an H200
// (tests/bench/RESULTS.md). Plain and linked launches alike.
TEST_F(CudaParityTest, ShallowTilesHoldTwoBlocksAnSm) {
  for (const cpu::AttentionShape& shape : {cpu::AttentionShape{32, 8, 128, 0}, cpu::AttentionShape{32, 32, 128, 0},
                                           cpu::AttentionShape{8, 4, 32, 0}, cpu::AttentionShape{28, 4, 128, 0}}) {
    EXPECT_EQ(cuda::DecodeBlocksPerSm(shape), 2)
        << shape.num_q_heads << "/" << shape.num_kv_heads << " heads, dim " << shape.head_dim;
  }
}

TEST_F(CudaParityTest, DecodeAttentionRejectsUnsupportedShapes) {
  const cuda::DecodePlan plan;
  absl::Status status = cuda::DecodeAttention({8, 8, 96, 0}, plan, nullptr, 0, nullptr, nullptr, nullptr, nullptr,
                                              nullptr, 0, 1, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("head_dim 96"), std::string::npos) << status;
  status = cuda::DecodeAttention({16, 1, 64, 0}, plan, nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 1,
                                 nullptr, nullptr);
  EXPECT_NE(status.message().find("16 query heads per KV head"), std::string::npos) << status;
}

TEST_F(CudaParityTest, PrefillAttentionCausal) {
  const std::vector<AttentionCase> cases = {
      {8, 8, 64, {1}}, {8, 2, 128, {19}}, {4, 1, 128, {200}}, {6, 6, 16, {77}}, {8, 4, 32, {513}},
      {12, 4, 64, {300}, 64},
  };
  for (const AttentionCase& c : cases) {
    const cpu::AttentionShape shape{c.q_heads, c.kv_heads, c.head_dim, c.sliding_window};
    const int64_t tokens = c.contexts[0];
    const int64_t q_size = c.q_heads * c.head_dim, kv_size = c.kv_heads * c.head_dim;
    const int64_t stride = q_size + 2 * kv_size;  // a fused qkv row
    const std::vector<float> qkv = Random(tokens * stride, 2.f);
    std::vector<float> want(tokens * q_size);
    cpu::PrefillAttention(shape, qkv.data(), stride, qkv.data() + q_size, qkv.data() + q_size + kv_size, stride,
                          want.data(), q_size, tokens);
    DeviceBuffer d_qkv = Upload(qkv), d_out = *DeviceBuffer::Create(want.size() * sizeof(float));
    const float* base = d_qkv.as<float>();
    ASSERT_TRUE(cuda::PrefillAttentionOnCudaCores(shape, base, stride, base + q_size, base + q_size + kv_size, stride,
                                                  d_out.as<float>(), q_size, tokens, nullptr).ok());
    ExpectNear(Download<float>(d_out, want.size()), want, 1e-5f, 1e-4f,
               "prefill attention on the CUDA cores, " + std::to_string(tokens) + " tokens");

    // On the tensor cores q, k and v go in as bf16: against the CPU over the same rounded inputs,
    // only the probabilities' rounding to bf16 remains (a part in 2^9 of each weight).
    const std::vector<float> rounded = RoundBf16(qkv);
    cpu::PrefillAttention(shape, rounded.data(), stride, rounded.data() + q_size, rounded.data() + q_size + kv_size,
                          stride, want.data(), q_size, tokens);
    ASSERT_TRUE(cuda::PrefillAttention(shape, base, stride, base + q_size, base + q_size + kv_size, stride,
                                       d_out.as<float>(), q_size, tokens, nullptr).ok());
    ExpectNear(Download<float>(d_out, want.size()), want, 1e-2f, 1e-2f,
               "prefill attention on the tensor cores, " + std::to_string(tokens) + " tokens");
  }
  // Rows the tensor-core kernel cannot read four floats at a time are refused, not misread.
  DeviceBuffer d_rows = *DeviceBuffer::Create(64 * sizeof(float));
  const absl::Status misaligned = cuda::PrefillAttention({2, 2, 16, 0}, d_rows.as<float>() + 1, 31, d_rows.as<float>(),
                                                         d_rows.as<float>(), 32, d_rows.as<float>(), 32, 1, nullptr);
  EXPECT_EQ(misaligned.code(), absl::StatusCode::kInvalidArgument) << misaligned;
}

TEST_F(CudaParityTest, StoreKvWritesBf16AtSlots) {
  const int64_t count = 5, kv_size = 96, stride = 300, num_slots = 20;
  const std::vector<float> rows = Random(count * stride);
  const std::vector<int32_t> slots = {7, 3, 19, 0, 11};
  DeviceBuffer d_rows = Upload(rows), d_slots = Upload(slots);
  DeviceBuffer d_k = Upload(std::vector<bf16>(num_slots * kv_size)), d_v = Upload(std::vector<bf16>(num_slots * kv_size));
  ASSERT_TRUE(cuda::StoreKv(d_rows.as<float>(), d_rows.as<float>() + 100, stride, d_slots.as<int32_t>(),
                            d_k.as<bf16>(), d_v.as<bf16>(), count, kv_size, nullptr).ok());
  const std::vector<float> k = DownloadBf16(d_k, num_slots * kv_size), v = DownloadBf16(d_v, num_slots * kv_size);
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t i = 0; i < kv_size; ++i) {
      ASSERT_EQ(k[slots[r] * kv_size + i], __bfloat162float(__float2bfloat16(rows[r * stride + i])));
      ASSERT_EQ(v[slots[r] * kv_size + i], __bfloat162float(__float2bfloat16(rows[r * stride + 100 + i])));
    }
  }
  EXPECT_EQ(k[1 * kv_size], 0.f);  // an untouched slot
}

class CudaSamplingTest : public CudaParityTest {
 protected:
  std::vector<int32_t> SampleRows(const std::vector<float>& logits, const std::vector<cuda::DeviceSamplingParams>& p,
                                  int64_t vocab) {
    DeviceBuffer d_logits = Upload(logits), d_params = Upload(p);
    DeviceBuffer d_tokens = Upload(std::vector<int32_t>(p.size(), -1));
    EXPECT_TRUE(cuda::Sample(d_logits.as<float>(), nullptr, d_params.as<cuda::DeviceSamplingParams>(), d_tokens.as<int32_t>(),
                             p.size(), vocab, nullptr).ok());
    return Download<int32_t>(d_tokens, p.size());
  }
};

TEST_F(CudaSamplingTest, GreedyIsTheCpuArgMaxWithTiesToTheLowestIndex) {
  const int64_t vocab = 128257, rows = 6;
  std::vector<float> logits = Random(rows * vocab, 10.f);
  logits[2 * vocab + 5] = logits[2 * vocab + 99999] = 50.f;  // a tie
  std::vector<cuda::DeviceSamplingParams> params(rows, {0.f, 0, 1.f, 1, 0});
  const std::vector<int32_t> got = SampleRows(logits, params, vocab);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * vocab;
    EXPECT_EQ(got[r], std::max_element(row, row + vocab) - row) << "row " << r;
  }
  EXPECT_EQ(got[2], 5);
}

TEST_F(CudaSamplingTest, EveryDrawEqualsTheCpuSamplerOnTheSameLogits) {
  // Both draw with the same fixed-point masses and (seed, counter) random numbers, so the token
  // is the same, not just the distribution. Rows are picked through the row index, with repeats.
  // A vocabulary of a multiple of 4 is read a float4 at a time, any other one float at a time.
  // Rows 0-3 hold logits rounded to quarters, so that many tie at the top-k and top-p thresholds.
  for (const int64_t vocab : {int64_t{128257}, int64_t{128256}}) {
    const int64_t logit_rows = 16;
    std::vector<float> logits = Random(logit_rows * vocab, 6.f);
    for (int64_t i = 0; i < 4 * vocab; ++i) logits[i] = std::round(logits[i] * 4.f) / 4.f;
    struct Case {
      float temperature;
      int32_t top_k;
      float top_p;
      float min_p = 0.f;
    };
    // min_p alone keeps a few tokens (0.2), thousands (1e-6, a band gathered) or more than any
    // band holds (1e-12, the whole row); with top-k and with top-p.
    const Case cases[] = {{0.f, 0, 1.f},          {1.f, 0, 1.f},
                          {0.7f, 50, 1.f},        {1.2f, 0, 0.9f},
                          {0.9f, 40, 0.8f},       {2.f, 1, 1.f},
                          {0.8f, 20000, 1.f},     {0.5f, 3000, 0.95f},
                          {1.f, 0, 1.f, 0.2f},    {1.f, 0, 1.f, 1e-6f},
                          {1.f, 0, 1.f, 1e-12f},  {0.8f, 50, 1.f, 0.01f},
                          {1.2f, 0, 0.9f, 1e-4f}, {0.9f, 2000, 0.95f, 1e-5f}};
    constexpr int kCases = sizeof(cases) / sizeof(cases[0]);
    std::vector<int32_t> rows;
    std::vector<SamplingParams> cpu_params;
    std::vector<cuda::DeviceSamplingParams> params;
    for (int i = 0; i < 30 * kCases; ++i) {
      const Case& c = cases[i % kCases];
      rows.push_back((i * 7) % logit_rows);
      SamplingParams sp{c.temperature, c.top_k, c.top_p, static_cast<uint64_t>(1000 + i / kCases)};
      sp.min_p = c.min_p;
      cpu_params.push_back(sp);
      params.push_back({sp.temperature, sp.top_k, sp.top_p, sp.seed, static_cast<uint64_t>(i), MinPLogitOffset(sp)});
    }
    DeviceBuffer d_logits = Upload(logits), d_rows = Upload(rows), d_params = Upload(params);
    // All draws in one launch (a block each), then launches of 33 and of 1 (a cluster of blocks
    // each: 4 and 8 on an H100's 132 SMs).
    for (const int64_t per_launch : {static_cast<int64_t>(params.size()), int64_t{33}, int64_t{1}}) {
      SCOPED_TRACE("draws per launch " + std::to_string(per_launch));
      DeviceBuffer d_tokens = Upload(std::vector<int32_t>(params.size(), -1));
      for (int64_t first = 0; first < static_cast<int64_t>(params.size()); first += per_launch) {
        const int64_t draws = std::min<int64_t>(per_launch, params.size() - first);
        ASSERT_TRUE(cuda::Sample(d_logits.as<float>(), d_rows.as<int32_t>() + first,
                                 d_params.as<cuda::DeviceSamplingParams>() + first, d_tokens.as<int32_t>() + first,
                                 draws, vocab, nullptr)
                        .ok());
      }
      const std::vector<int32_t> got = Download<int32_t>(d_tokens, params.size());
      int sampled_apart_from_greedy = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        const cuda::DeviceSamplingParams& p = params[i];
        const float* row = logits.data() + rows[i] * vocab;
        const int32_t want = SampleToken(row, vocab, cpu_params[i], p.counter);
        EXPECT_EQ(got[i], want) << "vocab " << vocab << ", draw " << i << " of row " << rows[i] << " at temperature "
                                << p.temperature << ", top_k " << p.top_k << ", top_p " << p.top_p << ", min_p "
                                << cpu_params[i].min_p;
        sampled_apart_from_greedy += want != ArgMax(row, vocab);
      }
      EXPECT_GT(sampled_apart_from_greedy, 120);  // the draws are not all greedy in disguise
    }
  }
}

TEST_F(CudaSamplingTest, DrawsFollowTheSoftmaxAndStayInsideTopKAndTopP) {
  const int64_t vocab = 10;
  const std::vector<float> row = {1.0f, 2.5f, 0.3f, -1.f, 2.0f, 0.f, 1.7f, -3.f, 0.9f, 2.2f};
  const int draws = 40000;
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p;
  };
  for (const Case& c : {Case{1.f, 0, 1.f}, Case{0.7f, 3, 1.f}, Case{1.3f, 0, 0.6f}, Case{1.f, 4, 0.8f}}) {
    // The CPU's kept set and probabilities, as Sampler computes them.
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
    const int64_t k = c.top_k > 0 ? c.top_k : vocab;
    std::vector<double> p(k);
    double z = 0;
    for (int64_t i = 0; i < k; ++i) z += p[i] = std::exp((row[order[i]] - row[order[0]]) / c.temperature);
    int64_t keep = k;
    double cumulative = 0;
    for (int64_t i = 0; i < k && c.top_p < 1.f; ++i) {
      cumulative += p[i] / z;
      if (cumulative >= c.top_p) {
        keep = i + 1;
        break;
      }
    }
    double kept_mass = 0;
    for (int64_t i = 0; i < keep; ++i) kept_mass += p[i];
    std::vector<double> expected(vocab, 0.0);
    for (int64_t i = 0; i < keep; ++i) expected[order[i]] = p[i] / kept_mass;

    std::vector<float> logits;
    std::vector<cuda::DeviceSamplingParams> params;
    for (int i = 0; i < draws; ++i) {
      logits.insert(logits.end(), row.begin(), row.end());
      params.push_back({c.temperature, c.top_k, c.top_p, 42, static_cast<uint64_t>(i)});
    }
    const std::vector<int32_t> got = SampleRows(logits, params, vocab);
    std::vector<double> freq(vocab, 0.0);
    for (int32_t t : got) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, vocab);
      freq[t] += 1.0 / draws;
    }
    for (int64_t i = 0; i < vocab; ++i) {
      if (expected[i] == 0) {
        EXPECT_EQ(freq[i], 0.0) << "token " << i << " is outside top_k/top_p but was drawn";
      } else {
        EXPECT_NEAR(freq[i], expected[i], 0.01) << "token " << i << " at temperature " << c.temperature;
      }
    }
    // Reproducible: the same seed and counters give the same tokens.
    EXPECT_EQ(SampleRows(logits, params, vocab), got);
  }
}

}  // namespace
}  // namespace lamina::kernels
