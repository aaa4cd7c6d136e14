#include "compute_node/sampling/sampler.h"

#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(SamplerTest, GreedyPicksTheLargestLogitAndTheLowestIdOnTies) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  Sampler sampler(SamplingParams{});
  EXPECT_EQ(sampler.Sample(logits.data(), 4), 1);
}

TEST(SamplerTest, TopKOfOneAndTinyTopPAreGreedy) {
  std::vector<float> logits = {0.5f, 0.4f, 3.0f, 0.3f};
  Sampler top_k(SamplingParams{1.0f, 1, 1.0f, 7});
  Sampler top_p(SamplingParams{1.0f, 0, 0.01f, 7});
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(top_k.Sample(logits.data(), 4), 2);
    EXPECT_EQ(top_p.Sample(logits.data(), 4), 2);
  }
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  std::vector<float> logits(100, 0.0f);
  Sampler a(SamplingParams{1.0f, 0, 1.0f, 42}), b(SamplingParams{1.0f, 0, 1.0f, 42}), c(SamplingParams{1.0f, 0, 1.0f, 43});
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 20; ++i) {
    ta.push_back(a.Sample(logits.data(), 100));
    tb.push_back(b.Sample(logits.data(), 100));
    tc.push_back(c.Sample(logits.data(), 100));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(SamplerTest, FrequenciesFollowTheTemperatureSoftmax) {
  // p ∝ exp(logit / T) with T = 0.5: logits ln(1), ln(2), ln(3) give 1 : 4 : 9.
  std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f)};
  Sampler sampler(SamplingParams{0.5f, 0, 1.0f, 1});
  std::map<int32_t, int> counts;
  const int n = 28000;
  for (int i = 0; i < n; ++i) ++counts[sampler.Sample(logits.data(), 3)];
  EXPECT_NEAR(counts[0] / double(n), 1 / 14.0, 0.01);
  EXPECT_NEAR(counts[1] / double(n), 4 / 14.0, 0.015);
  EXPECT_NEAR(counts[2] / double(n), 9 / 14.0, 0.015);
}

TEST(SamplerTest, TopPKeepsTheSmallestSetReachingP) {
  // Probabilities 0.5, 0.3, 0.2: top_p 0.7 keeps the first two (0.8 >= 0.7).
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler sampler(SamplingParams{1.0f, 0, 0.7f, 3});
  std::map<int32_t, int> counts;
  for (int i = 0; i < 8000; ++i) ++counts[sampler.Sample(logits.data(), 3)];
  EXPECT_EQ(counts[2], 0);
  EXPECT_NEAR(counts[0] / 8000.0, 0.5 / 0.8, 0.03);
}

TEST(SamplerTest, ValidateNamesTheBadField) {
  auto message = [](const SamplingParams& p) { return std::string(p.Validate().message()); };
  EXPECT_NE(message({-1.0f, 0, 1.0f, 0}).find("temperature"), std::string::npos);
  EXPECT_NE(message({1.0f, -2, 1.0f, 0}).find("top_k"), std::string::npos);
  EXPECT_NE(message({1.0f, 0, 0.0f, 0}).find("top_p"), std::string::npos);
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
}

}  // namespace
}  // namespace lamina
