#include "compute_node/sampling/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace lamina {
namespace {

// Token frequencies over counters 0..n-1.
std::map<int32_t, double> Frequencies(const std::vector<float>& logits, const SamplingParams& params, int n) {
  std::map<int32_t, double> freq;
  for (int i = 0; i < n; ++i) freq[SampleToken(logits.data(), logits.size(), params, i)] += 1.0 / n;
  return freq;
}

TEST(SamplerTest, GreedyPicksTheLargestLogitAndTheLowestIdOnTies) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(SampleToken(logits.data(), 4, SamplingParams{}, 0), 1);
  EXPECT_EQ(ArgMax(logits.data(), 4), 1);
  std::vector<float> none = {-INFINITY, -INFINITY};
  EXPECT_EQ(ArgMax(none.data(), 2), 0);
}

TEST(SamplerTest, TopKOfOneAndTinyTopPAreGreedy) {
  std::vector<float> logits = {0.5f, 0.4f, 3.0f, 0.3f};
  for (uint64_t counter = 0; counter < 50; ++counter) {
    EXPECT_EQ(SampleToken(logits.data(), 4, {1.0f, 1, 1.0f, 7}, counter), 2);
    EXPECT_EQ(SampleToken(logits.data(), 4, {1.0f, 0, 0.01f, 7}, counter), 2);
  }
}

TEST(SamplerTest, ADrawDependsOnlyOnSeedAndCounter) {
  std::vector<float> logits(100, 0.0f);
  std::vector<int32_t> a, b, c;
  for (uint64_t i = 0; i < 20; ++i) a.push_back(SampleToken(logits.data(), 100, {1.0f, 0, 1.0f, 42}, i));
  for (uint64_t i = 20; i-- > 0;) b.insert(b.begin(), SampleToken(logits.data(), 100, {1.0f, 0, 1.0f, 42}, i));
  for (uint64_t i = 0; i < 20; ++i) c.push_back(SampleToken(logits.data(), 100, {1.0f, 0, 1.0f, 43}, i));
  EXPECT_EQ(a, b);  // in any order
  EXPECT_NE(a, c);
}

TEST(SamplerTest, FrequenciesFollowTheTemperatureSoftmax) {
  // p ∝ exp(logit / T) with T = 0.5: logits ln(1), ln(2), ln(3) give 1 : 4 : 9.
  std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f)};
  std::map<int32_t, double> freq = Frequencies(logits, {0.5f, 0, 1.0f, 1}, 28000);
  EXPECT_NEAR(freq[0], 1 / 14.0, 0.01);
  EXPECT_NEAR(freq[1], 4 / 14.0, 0.015);
  EXPECT_NEAR(freq[2], 9 / 14.0, 0.015);
}

TEST(SamplerTest, TopPKeepsTheSmallestSetReachingP) {
  // Probabilities 0.5, 0.3, 0.2: top_p 0.7 keeps the first two (0.8 >= 0.7).
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::map<int32_t, double> freq = Frequencies(logits, {1.0f, 0, 0.7f, 3}, 8000);
  EXPECT_EQ(freq[2], 0.0);
  EXPECT_NEAR(freq[0], 0.5 / 0.8, 0.03);
}

TEST(SamplerTest, TopKKeepsEveryLogitTiedWithTheKth) {
  // top_k 2 over {3, 1, 1, 0}: the two 1s tie for second place, so both stay; 0 never comes.
  std::vector<float> logits = {3.0f, 1.0f, 1.0f, 0.0f};
  std::map<int32_t, double> freq = Frequencies(logits, {4.0f, 2, 1.0f, 5}, 6000);
  EXPECT_GT(freq[1], 0.1);
  EXPECT_GT(freq[2], 0.1);
  EXPECT_EQ(freq[3], 0.0);
}

TEST(SamplerTest, MinPKeepsTokensAtLeastMinPTimesAsLikelyAsTheMostLikely) {
  // At T = 1 the probabilities are in the ratios 1 : 0.5 : 0.25 : 0.1: min_p 0.3 keeps two.
  const std::vector<float> logits = {0.0f, std::log(0.5f), std::log(0.25f), std::log(0.1f)};
  SamplingParams params{1.0f, 0, 1.0f, 9};
  params.min_p = 0.3f;
  std::map<int32_t, double> freq = Frequencies(logits, params, 6000);
  EXPECT_EQ(freq[2], 0.0);
  EXPECT_EQ(freq[3], 0.0);
  EXPECT_NEAR(freq[0], 2 / 3.0, 0.03);
  // At T = 2 they are 1 : 0.71 : 0.5 : 0.32: all four stay.
  params.temperature = 2.0f;
  freq = Frequencies(logits, params, 6000);
  EXPECT_GT(freq[3], 0.05);
  // top_p 0.4 of what min_p 0.4 keeps (0.45 : 0.32 : 0.23 of three): the first alone.
  params.min_p = 0.4f;
  params.top_p = 0.4f;
  freq = Frequencies(logits, params, 2000);
  EXPECT_EQ(freq.size(), 1u);
  EXPECT_NEAR(freq[0], 1.0, 1e-9);
  // min_p 1 keeps the most likely and its ties only.
  params = SamplingParams{1.0f, 0, 1.0f, 9};
  params.min_p = 1.0f;
  freq = Frequencies({2.0f, 1.0f, 2.0f}, params, 2000);
  EXPECT_EQ(freq[1], 0.0);
  EXPECT_GT(freq[0], 0.4);
  EXPECT_GT(freq[2], 0.4);
}

TEST(SamplerTest, ValidateNamesTheBadField) {
  auto message = [](const SamplingParams& p) { return std::string(p.Validate().message()); };
  EXPECT_NE(message({-1.0f, 0, 1.0f, 0}).find("temperature"), std::string::npos);
  EXPECT_NE(message({1.0f, -2, 1.0f, 0}).find("top_k"), std::string::npos);
  EXPECT_NE(message({1.0f, 0, 0.0f, 0}).find("top_p"), std::string::npos);
  EXPECT_NE(message({1.0f, 0, 1.0f, 0, true, 21}).find("top_logprobs must be from 0 to 20, got 21"), std::string::npos);
  EXPECT_NE(message({1.0f, 0, 1.0f, 0, false, -1}).find("top_logprobs"), std::string::npos);
  SamplingParams min_p;
  min_p.min_p = 1.5f;
  EXPECT_EQ(message(min_p), "min_p must be from 0 to 1, got 1.5");
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
  EXPECT_TRUE((SamplingParams{0.0f, 0, 1.0f, 0, true, 20}).Validate().ok());
}

}  // namespace
}  // namespace lamina
