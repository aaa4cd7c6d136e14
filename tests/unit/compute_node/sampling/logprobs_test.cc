#include "compute_node/sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "compute_node/sampling/sampler.h"
#include "gtest/gtest.h"

namespace lamina {
namespace {

// log_softmax in long double, written plainly: the reference.
std::vector<long double> LogSoftmax(const std::vector<float>& logits) {
  long double max = -INFINITY;
  for (float v : logits) max = std::max<long double>(max, v);
  long double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<long double>(v) - max);
  std::vector<long double> out;
  for (float v : logits) out.push_back(v - max - std::log(sum));
  return out;
}

// Ids by decreasing logit, the lower id first among equals.
std::vector<int32_t> Ranked(const std::vector<float>& logits) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  return ids;
}

std::vector<float> RandomLogits(int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> logits(vocab);
  for (float& v : logits) v = normal(rng);
  // Ties among the largest, so that their order is tested too.
  logits[vocab / 3] = logits[vocab / 2] = logits[vocab - 1] = 30.0f;
  return logits;
}

TEST(LogprobsTest, EqualLogSoftmaxAndRankTheMostLikelyFirstLowerIdsFirstOnTies) {
  for (int64_t vocab : {7, 1000, 128256}) {
    const std::vector<float> logits = RandomLogits(vocab, static_cast<uint32_t>(vocab));
    const std::vector<long double> reference = LogSoftmax(logits);
    const std::vector<int32_t> ranked = Ranked(logits);
    for (int32_t top : {0, 1, 3, 20}) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << ", top " << top);
      const int32_t token = static_cast<int32_t>(vocab / 5);
      const TokenLogprobs got = ComputeLogprobs(logits.data(), vocab, token, top);
      EXPECT_NEAR(got.logprob, static_cast<double>(reference[token]), 1e-5);
      ASSERT_EQ(got.top_count, std::min<int64_t>(top, vocab));
      for (int32_t k = 0; k < got.top_count; ++k) {
        EXPECT_EQ(got.top_ids[k], ranked[k]) << "rank " << k;
        EXPECT_NEAR(got.top_logprobs[k], static_cast<double>(reference[ranked[k]]), 1e-5) << "rank " << k;
      }
    }
  }
}

TEST(LogprobsTest, TheTiedLargestComeInIdOrderAndAreEquallyLikely) {
  const std::vector<float> logits = RandomLogits(1000, 3);
  const TokenLogprobs got = ComputeLogprobs(logits.data(), 1000, 0, 3);
  EXPECT_EQ(got.top_ids[0], 333);
  EXPECT_EQ(got.top_ids[1], 500);
  EXPECT_EQ(got.top_ids[2], 999);
  EXPECT_EQ(got.top_logprobs[0], got.top_logprobs[2]);
  // Three tokens share nearly all the mass.
  EXPECT_NEAR(got.top_logprobs[0], std::log(1.0 / 3.0), 1e-4);
}

TEST(LogprobsTest, MaskedTokensHaveNoProbabilityAndSmallRowsGiveAllTheyHave) {
  const std::vector<float> logits = {-INFINITY, 0.0f, -INFINITY, 0.0f};
  const TokenLogprobs got = ComputeLogprobs(logits.data(), 4, 2, 20);
  EXPECT_EQ(got.logprob, -INFINITY);
  ASSERT_EQ(got.top_count, 4);
  EXPECT_EQ(got.top_ids[0], 1);
  EXPECT_EQ(got.top_ids[1], 3);
  EXPECT_NEAR(got.top_logprobs[0], std::log(0.5), 1e-7);
  EXPECT_EQ(got.top_ids[2], 0);
  EXPECT_EQ(got.top_logprobs[2], -INFINITY);
}

TEST(LogprobsTest, TheDrawnTokensLogprobIsOfTheRawLogitsWhateverTheTemperature) {
  const std::vector<float> logits = RandomLogits(1000, 9);
  const std::vector<long double> reference = LogSoftmax(logits);
  const SamplingParams hot{2.0f, 0, 1.0f, 5, true, 0};
  for (uint64_t counter = 0; counter < 20; ++counter) {
    const int32_t token = SampleToken(logits.data(), 1000, hot, counter);
    EXPECT_NEAR(ComputeLogprobs(logits.data(), 1000, token, 0).logprob, static_cast<double>(reference[token]), 1e-5);
  }
}

}  // namespace
}  // namespace lamina
