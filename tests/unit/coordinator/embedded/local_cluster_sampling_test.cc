// Sampling parameters in single-process mode: repetition, presence and frequency penalties against
// a reference written apart from compute_node/sampling/penalties.h (on the golden logits, and on
// the engine's own logits at every step of a long generation), and min_p against the raw log
// probabilities of each draw.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "compute_node/engine/compute_engine.h"
#include "coordinator/embedded/local_cluster.h"
#include "gtest/gtest.h"
#include "kv/attention/attention_executor.h"
#include "tests/support/golden.h"

namespace lamina {
namespace {

using ::lamina::testing::GoldenTensors;
using ::lamina::testing::LoadGoldenJson;
using ::lamina::testing::ModelDir;

SamplingParams Penalties(float repetition, float presence, float frequency) {
  SamplingParams params;
  params.repetition_penalty = repetition;
  params.presence_penalty = presence;
  params.frequency_penalty = frequency;
  return params;
}

// The logits a penalized draw sees, in double: every token of the prompt or of `generated` has its
// logit divided by the repetition penalty when positive and multiplied by it otherwise; each
// generated one then loses the frequency penalty per time it was generated and the presence
// penalty once.
std::vector<double> Penalized(const float* logits, int64_t vocab, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& generated, const SamplingParams& p) {
  std::vector<double> out(logits, logits + vocab);
  std::set<int32_t> seen(prompt.begin(), prompt.end());
  std::map<int32_t, int> times;
  for (int32_t t : generated) {
    seen.insert(t);
    ++times[t];
  }
  for (int32_t t : seen) out[t] = out[t] > 0 ? out[t] / p.repetition_penalty : out[t] * p.repetition_penalty;
  for (const auto& [t, n] : times) out[t] -= p.frequency_penalty * n + p.presence_penalty;
  return out;
}

int32_t Best(const std::vector<double>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Generates one request's greedy tokens; also the drawn tokens' log probabilities.
std::vector<int32_t> Generate(LocalCluster& cluster, const GenerationRequest& r,
                              std::vector<float>* logprobs = nullptr) {
  std::vector<int32_t> ids;
  EXPECT_TRUE(cluster
                  .Generate({&r, 1},
                            [&](const TokenEvent& e) {
                              ids.push_back(e.token);
                              if (logprobs != nullptr && e.logprobs != nullptr)
                                logprobs->push_back(e.logprobs->logprob);
                            })
                  .ok());
  return ids;
}

GenerationRequest Greedy(std::vector<int32_t> prompt, int32_t max_tokens, const SamplingParams& sampling) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling = sampling;
  return r;
}

class PenaltiesGoldenTest : public ::testing::TestWithParam<std::string> {};

// The first token drawn under a repetition penalty is the largest of the golden logits (float64)
// after the prompt, penalized: one that discourages the prompt's tokens (20) and one that favours
// them (0.1).
TEST_P(PenaltiesGoldenTest, FirstGreedyTokenIsTheLargestOfThePenalizedGoldenLogits) {
  auto cluster = LocalCluster::Load(ModelDir(GetParam()));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  GoldenTensors golden(GetParam());
  const int num_prompts = static_cast<int>(LoadGoldenJson(GetParam())["prompts"].size());
  for (float repetition : {20.0f, 0.1f}) {
    const SamplingParams params = Penalties(repetition, 0.0f, 0.0f);
    int changed = 0;
    for (int p = 0; p < num_prompts; ++p) {
      const std::string key = "prompt_" + std::to_string(p);
      const std::vector<int32_t> prompt = golden.Ids(key + ".ids");
      // The demo model's fixture keeps the logits of each greedy step, the first after the
      // prompt; the tiny models' keep every prompt position.
      const bool demo = GetParam() == "lamina-demo-6m";
      const Tensor rows = golden.Float(key + (demo ? ".greedy_logits" : ".prefill_logits"));
      const std::vector<double> want = Penalized(rows.row(demo ? 0 : rows.dim(0) - 1), rows.dim(1), prompt, {}, params);
      const std::vector<int32_t> got = Generate(**cluster, Greedy(prompt, 1, params));
      ASSERT_EQ(got.size(), 1u);
      // The engine's logits are within the fixtures' tolerance of the golden ones: a near tie may
      // go either way.
      EXPECT_NEAR(want[got[0]], want[Best(want)], 2e-2 * std::fabs(want[Best(want)]))
          << key << ", repetition penalty " << repetition;
      changed += Best(want) != golden.Ids(key + ".greedy_ids")[0] ? 1 : 0;
    }
    std::printf("%s: repetition penalty %g changed the first greedy token of %d of %d prompts\n", GetParam().c_str(),
                repetition, changed, num_prompts);
  }
}

INSTANTIATE_TEST_SUITE_P(AllModels, PenaltiesGoldenTest,
                         ::testing::Values("tiny-llama2", "tiny-llama3", "lamina-demo-6m"));

// Every token of a long penalized greedy generation is the largest of the logits before it,
// penalized by the prompt and the tokens generated before it, and its log probability is that of
// the raw logits. The logits come from a prefill of the whole generated sequence.
TEST(PenaltiesTest, EveryGreedyTokenIsTheLargestOfItsPenalizedLogits) {
  auto cluster = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->SetKvDtype("float32").ok());
  const std::vector<int32_t> prompt = (*cluster)->tokenizer().EncodePrompt("We are the");
  SamplingParams params = Penalties(2.0f, 1.5f, 1.0f);
  params.logprobs = true;
  std::vector<float> logprobs;
  const std::vector<int32_t> ids = Generate(**cluster, Greedy(prompt, 40, params), &logprobs);
  ASSERT_EQ(ids.size(), 40u);
  ASSERT_EQ(logprobs.size(), 40u);
  std::vector<int32_t> plain = Generate(**cluster, Greedy(prompt, 40, SamplingParams{}));
  EXPECT_NE(ids, plain) << "the penalties changed nothing: the test would prove nothing";

  auto weights = ModelWeights::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(weights.ok()) << weights.status();
  const ModelConfig& c = (*weights)->config;
  auto memory = AttentionExecutor::Create(
      {c.num_layers, 4096, {c.num_q_heads, c.num_kv_heads, c.head_dim, c.sliding_window}, -1, DType::kF32});
  ASSERT_TRUE(memory.ok()) << memory.status();
  ComputeEngine engine(weights->get(), memory->get());
  std::vector<int32_t> sequence = prompt;
  sequence.insert(sequence.end(), ids.begin(), ids.end() - 1);
  PrefillSequence whole{0, sequence};
  Tensor logits;
  ASSERT_TRUE(engine.Prefill({&whole, 1}, /*all_positions=*/true, &logits).ok());
  int repeats_left = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    const float* raw = logits.row(static_cast<int64_t>(prompt.size() + k) - 1);
    const std::vector<int32_t> before(ids.begin(), ids.begin() + k);
    const std::vector<double> want = Penalized(raw, c.vocab_size, prompt, before, params);
    EXPECT_NEAR(want[ids[k]], want[Best(want)], 1e-4) << "token " << k;
    double max = -INFINITY, sum = 0.0;
    for (int64_t t = 0; t < c.vocab_size; ++t) max = std::max<double>(max, raw[t]);
    for (int64_t t = 0; t < c.vocab_size; ++t) sum += std::exp(raw[t] - max);
    EXPECT_NEAR(logprobs[k], raw[ids[k]] - max - std::log(sum), 1e-4) << "token " << k << ": raw, not penalized";
    repeats_left += std::find(before.begin(), before.end(), ids[k]) != before.end() ? 1 : 0;
  }
  std::printf("%d of 40 penalized tokens repeat an earlier one\n", repeats_left);
}

// Each sample of an n request counts its own tokens: sample k equals a single request with seed
// + k, penalties included.
TEST(PenaltiesTest, EachSampleOfAnNRequestCountsItsOwnTokens) {
  auto cluster = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  SamplingParams params = Penalties(2.0f, 1.5f, 1.0f);
  params.temperature = 1.0f;
  params.seed = 90;
  GenerationRequest r = Greedy((*cluster)->tokenizer().EncodePrompt("We"), 24, params);
  r.n = 3;
  std::map<int32_t, std::vector<int32_t>> samples;
  ASSERT_TRUE((*cluster)->Generate({&r, 1}, [&](const TokenEvent& e) { samples[e.sample].push_back(e.token); }).ok());
  ASSERT_EQ(samples.size(), 3u);
  for (int32_t k = 0; k < 3; ++k) {
    GenerationRequest single = r;
    single.n = 1;
    single.sampling.seed = 90 + k;
    EXPECT_EQ(Generate(**cluster, single), samples[k]) << "sample " << k;
  }
  GenerationRequest unpenalized = r;
  unpenalized.n = 1;
  unpenalized.sampling = SamplingParams{};
  unpenalized.sampling.temperature = 1.0f;
  unpenalized.sampling.seed = 90;
  EXPECT_NE(Generate(**cluster, unpenalized), samples[0]);
}

// Every token drawn with min_p is at least min_p times as likely, at the temperature, as the most
// likely one at its step: (logprob - the top logprob) / T >= ln(min_p); without min_p some are not.
TEST(MinPTest, EveryDrawIsWithinMinPOfTheMostLikelyToken) {
  auto cluster = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  SamplingParams params{1.5f, 0, 1.0f, 31};
  params.top_logprobs = 1;
  GenerationRequest r = Greedy((*cluster)->tokenizer().EncodePrompt("We"), 64, params);
  r.n = 4;
  auto lowest_ratio = [&](const GenerationRequest& request) {  // the smallest ln(p / p_max) at T
    double lowest = 0.0;
    EXPECT_TRUE((*cluster)
                    ->Generate({&request, 1},
                               [&](const TokenEvent& e) {
                                 ASSERT_NE(e.logprobs, nullptr);
                                 ASSERT_EQ(e.logprobs->top_count, 1);
                                 lowest = std::min<double>(
                                     lowest, (e.logprobs->logprob - e.logprobs->top_logprobs[0]) / params.temperature);
                               })
                    .ok());
    return lowest;
  };
  EXPECT_LT(lowest_ratio(r), std::log(0.1)) << "without min_p some draw is unlikely: the test would prove nothing";
  r.sampling.min_p = 0.1f;
  EXPECT_GE(lowest_ratio(r), std::log(0.1) - 1e-5);
}

TEST(PenaltiesTest, ABadPenaltyIsRefusedNamingTheRequestAndTheField) {
  auto cluster = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  GenerationRequest good = Greedy((*cluster)->tokenizer().EncodePrompt("We"), 4, SamplingParams{});
  GenerationRequest bad = Greedy(good.prompt, 4, Penalties(1.0f, 0.0f, 2.5f));
  absl::Status status = (*cluster)->Generate({good, bad}, [](const TokenEvent&) {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("request 2"), std::string::npos) << status;
  EXPECT_NE(status.message().find("frequency_penalty must be from -2 to 2, got 2.5"), std::string::npos) << status;
}

}  // namespace
}  // namespace lamina
