// A tensor-parallel split computes what the whole model does: ranks holding their shards of a
// model, joined by a RankGroup, run the same slices as the whole model and end each with the same
// residual stream and logits, and their engines give the golden logits.
#include "compute_node/tensor_parallel/shard.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/threading/thread_pool.h"
#include "compute_node/engine/compute_engine.h"
#include "compute_node/engine/cpu_slice_backend.h"
#include "compute_node/engine/model_slices.h"
#include "gtest/gtest.h"
#include "kv/attention/attention_executor.h"
#include "tests/support/golden.h"

namespace lamina {
namespace {

float MaxDifference(const float* a, const float* b, int64_t n) {
  float most = 0;
  for (int64_t i = 0; i < n; ++i) most = std::max(most, std::fabs(a[i] - b[i]));
  return most;
}

TEST(ShardTest, RanksOfTwoAndFourComputeTheWholeModelsSlices) {
  auto whole = ModelWeights::Load(testing::ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(whole.ok()) << whole.status();
  const ModelConfig& c = (*whole)->config;
  ThreadPool pool(1);
  const std::vector<int32_t> tokens = {3, 141, 59, 265, 35};
  const std::vector<int64_t> rows = {0, 2, 4};
  // A made-up attention output [tokens, q_size], the same for the whole model and the ranks.
  Tensor attn_out({static_cast<int64_t>(tokens.size()), c.q_size()});
  for (int64_t i = 0; i < attn_out.size(); ++i) attn_out.data()[i] = std::sin(0.37f * static_cast<float>(i));

  ModelSlices reference(whole->get(), &pool);
  SliceState want;
  want.positions = {0, 1, 2, 3, 4};
  reference.RunFirst(tokens, &want);
  const Tensor want_first_qkv = want.qkv.Clone();
  want.attn_out = attn_out.Clone();
  ASSERT_TRUE(reference.RunMiddle(1, &want).ok());
  const Tensor want_residual = want.residual.Clone();
  want.attn_out = attn_out.Clone();
  Tensor want_logits;
  ASSERT_TRUE(reference.RunLast(rows, &want, &want_logits).ok());

  for (int size : {2, 4}) {
    SCOPED_TRACE(::testing::Message() << size << " ranks");
    std::unique_ptr<Transport> transport = MakeInprocTransport();
    std::vector<std::thread> ranks;
    for (int r = 0; r < size; ++r) {
      ranks.emplace_back([&, r] {
        auto shard = ModelWeights::Load(testing::ModelDir("lamina-demo-6m"));
        ASSERT_TRUE(shard.ok());
        ShardWeights(r, size, shard->get());
        const ModelConfig& part = (*shard)->config;
        ASSERT_EQ(part.num_q_heads, c.num_q_heads / size);
        auto group = RankGroup::Join(transport.get(), r, size, absl::StrCat("shard-test-", size), absl::Seconds(5),
                                     absl::Now() + absl::Seconds(5));
        ASSERT_TRUE(group.ok()) << group.status();
        ThreadPool rank_pool(1);
        ModelSlices slices(shard->get(), &rank_pool, group->get());
        SliceState s;
        s.positions = want.positions;
        slices.RunFirst(tokens, &s);
        // This rank's q, k and v columns of the whole model's.
        const int64_t q = part.q_size(), kv = part.kv_size(), n = static_cast<int64_t>(tokens.size());
        for (int64_t t = 0; t < n; ++t) {
          const float* got = s.qkv.row(t);
          const float* all = want_first_qkv.row(t);
          EXPECT_LT(MaxDifference(got, all + r * q, q), 1e-5f) << "q, token " << t;
          EXPECT_LT(MaxDifference(got + q, all + c.q_size() + r * kv, kv), 1e-5f) << "k, token " << t;
          EXPECT_LT(MaxDifference(got + q + kv, all + c.q_size() + c.kv_size() + r * kv, kv), 1e-5f) << "v, token " << t;
        }
        // Its heads' columns of the attention output.
        Tensor mine({n, q});
        for (int64_t t = 0; t < n; ++t) std::copy_n(attn_out.row(t) + r * q, q, mine.row(t));
        s.attn_out = mine.Clone();
        ASSERT_TRUE(slices.RunMiddle(1, &s).ok());
        EXPECT_LT(MaxDifference(s.residual.data(), want_residual.data(), want_residual.size()), 1e-4f);
        s.attn_out = mine.Clone();
        Tensor logits;
        ASSERT_TRUE(slices.RunLast(rows, &s, &logits).ok());
        ASSERT_EQ(logits.shape(), want_logits.shape());
        EXPECT_LT(MaxDifference(logits.data(), want_logits.data(), logits.size()), 1e-4f);
      });
    }
    for (std::thread& t : ranks) t.join();
  }
}

// Whole engines per rank (prefill, then teacher-forced decode), each attending its heads in a KV
// pool of its own: every rank's logits within float32's tolerance of the golden (float64) ones.
// Each rank reads only its slices of the checkpoint (ModelWeights::Load with the rank's share):
// bit for bit what cutting the whole model gives (ShardWeights), every tensor, with the rank's
// config; a layer split's share and a rank's combine.
TEST(ShardTest, ARankReadsExactlyItsSlicesOfTheCheckpoint) {
  for (int size : {2, 4}) {
    for (int rank = 0; rank < size; ++rank) {
      SCOPED_TRACE(::testing::Message() << "rank " << rank << " of " << size);
      auto cut = ModelWeights::Load(testing::ModelDir("lamina-demo-6m"));
      ASSERT_TRUE(cut.ok()) << cut.status();
      ShardWeights(rank, size, cut->get());
      WeightShare share;
      share.rank = rank;
      share.ranks = size;
      auto read = ModelWeights::Load(testing::ModelDir("lamina-demo-6m"), share);
      ASSERT_TRUE(read.ok()) << read.status();
      const ModelWeights& a = **cut;
      const ModelWeights& b = **read;
      EXPECT_EQ(b.config.num_q_heads, a.config.num_q_heads);
      EXPECT_EQ(b.config.num_kv_heads, a.config.num_kv_heads);
      EXPECT_EQ(b.config.intermediate_size, a.config.intermediate_size);
      auto same = [](const Tensor& x, const Tensor& y, const std::string& what) {
        ASSERT_EQ(x.shape(), y.shape()) << what;
        ASSERT_TRUE(std::equal(x.data(), x.data() + x.size(), y.data())) << what;
      };
      same(a.embed, b.embed, "embed");
      same(a.final_norm, b.final_norm, "final_norm");
      same(a.lm_head, b.lm_head, "lm_head");
      ASSERT_EQ(a.layers.size(), b.layers.size());
      for (size_t l = 0; l < a.layers.size(); ++l) {
        const std::string layer = absl::StrCat("layer ", l, " ");
        same(a.layers[l].input_norm, b.layers[l].input_norm, layer + "input_norm");
        same(a.layers[l].qkv, b.layers[l].qkv, layer + "qkv");
        same(a.layers[l].qkv_bias, b.layers[l].qkv_bias, layer + "qkv_bias");
        same(a.layers[l].o_proj, b.layers[l].o_proj, layer + "o_proj");
        same(a.layers[l].post_norm, b.layers[l].post_norm, layer + "post_norm");
        same(a.layers[l].gate_up, b.layers[l].gate_up, layer + "gate_up");
        same(a.layers[l].down, b.layers[l].down, layer + "down");
      }
    }
  }
  WeightShare split_rank;
  split_rank.first_layer = 2;
  split_rank.end_layer = 4;
  split_rank.rank = 1;
  split_rank.ranks = 2;
  auto both = ModelWeights::Load(testing::ModelDir("lamina-demo-6m"), split_rank);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ((*both)->layers[1].o_proj.size(), 0) << "outside the split";
  EXPECT_EQ((*both)->layers[2].o_proj.dim(1), (*both)->config.q_size()) << "the rank's columns";
}

TEST(ShardTest, RankEnginesGiveTheGoldenLogits) {
  struct Case {
    std::string model;
    int size;
    // The fixtures' rows: the demo model's row 0 is the prompt's last position and row s follows
    // greedy[s - 1]; the tiny models' row s follows greedy[s].
    bool first_row_from_prompt = false;
  };
  for (const Case& tc : std::vector<Case>{{"tiny-llama2", 2}, {"tiny-llama3", 2}, {"lamina-demo-6m", 2, true},
                                          {"lamina-demo-6m", 4, true}}) {
    SCOPED_TRACE(::testing::Message() << tc.model << ", " << tc.size << " ranks");
    testing::GoldenTensors golden(tc.model);
    const std::vector<int32_t> ids = golden.Ids("prompt_0.ids");
    const std::vector<int32_t> greedy = golden.Ids("prompt_0.greedy_ids");
    const Tensor expected = golden.Float("prompt_0.greedy_logits");
    std::unique_ptr<Transport> transport = MakeInprocTransport();
    std::vector<std::thread> ranks;
    for (int r = 0; r < tc.size; ++r) {
      ranks.emplace_back([&, r] {
        auto weights = ModelWeights::Load(testing::ModelDir(tc.model));
        ASSERT_TRUE(weights.ok()) << weights.status();
        ShardWeights(r, tc.size, weights->get());
        const ModelConfig& c = (*weights)->config;
        auto pool = AttentionExecutor::Create({c.num_layers, 1024, {c.num_q_heads, c.num_kv_heads, c.head_dim,
                                                                     c.sliding_window}});
        ASSERT_TRUE(pool.ok()) << pool.status();
        auto group = RankGroup::Join(transport.get(), r, tc.size, absl::StrCat("golden-", tc.model, "-", tc.size),
                                     absl::Seconds(20), absl::Now() + absl::Seconds(20));
        ASSERT_TRUE(group.ok()) << group.status();
        ThreadPool threads(1);
        ComputeEngine engine(std::make_unique<CpuSliceBackend>(weights->get(), &threads, group->get()),
                             std::make_unique<CpuSliceBackend>(weights->get(), &threads, group->get()), pool->get());
        Tensor logits;
        ASSERT_TRUE(engine.Prefill({{1, ids}}, false, &logits).ok());
        const int64_t steps = std::min<int64_t>(4, expected.dim(0));
        const int64_t shift = tc.first_row_from_prompt ? 1 : 0;
        for (int64_t step = 0; step < steps; ++step) {
          if (step > 0 || shift == 0) {
            const int64_t fed = step - shift;
            const int32_t position = static_cast<int32_t>(ids.size() + fed);
            ASSERT_TRUE(engine.Decode({{1, greedy[fed], position}}, &logits).ok());
          }
          EXPECT_LT(testing::RelativeError(logits.row(0), expected.row(step), expected.dim(1)), 1e-4)
              << tc.model << ", rank " << r << " of " << tc.size << ", step " << step;
        }
      });
    }
    for (std::thread& t : ranks) t.join();
  }
}

}  // namespace
}  // namespace lamina
