#include "coordinator/embedded/local_cluster.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/golden.h"

namespace lamina {
namespace {

using ::lamina::testing::GoldenTensors;
using ::lamina::testing::LoadGoldenJson;
using ::lamina::testing::ModelDir;

struct Output {
  std::vector<int32_t> ids;
  FinishReason finish = FinishReason::kNone;
  int events_after_finish = 0;
};

std::vector<Output> GenerateAll(LocalCluster& cluster, const std::vector<GenerationRequest>& requests) {
  std::vector<Output> outputs(requests.size());
  absl::Status status = cluster.Generate(requests, [&](const TokenEvent& e) {
    Output& o = outputs[e.request];
    if (o.finish != FinishReason::kNone) ++o.events_after_finish;
    o.ids.push_back(e.token);
    o.finish = e.finish;
  });
  EXPECT_TRUE(status.ok()) << status;
  return outputs;
}

GenerationRequest Greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

class LocalClusterGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LocalClusterGoldenTest, GreedyIdsMatchGoldenAndABatchMatchesEachAlone) {
  auto cluster = LocalCluster::Load(ModelDir(GetParam()));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  GoldenTensors golden(GetParam());
  const int num_prompts = static_cast<int>(LoadGoldenJson(GetParam())["prompts"].size());
  std::vector<GenerationRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  for (int p = 0; p < num_prompts; ++p) {
    const std::string key = "prompt_" + std::to_string(p);
    expected.push_back(golden.Ids(key + ".greedy_ids"));
    requests.push_back(Greedy(golden.Ids(key + ".ids"), static_cast<int32_t>(expected.back().size())));
  }
  std::vector<Output> batched = GenerateAll(**cluster, requests);
  for (int p = 0; p < num_prompts; ++p) {
    EXPECT_EQ(batched[p].ids, expected[p]) << "prompt " << p << " in a batch";
    EXPECT_EQ(batched[p].finish, FinishReason::kMaxTokens);
    EXPECT_EQ(batched[p].events_after_finish, 0);
    std::vector<Output> alone = GenerateAll(**cluster, {requests[p]});
    EXPECT_EQ(alone[0].ids, batched[p].ids) << "prompt " << p << " alone";
  }
}

// The golden logits after which greedy token k of prompt p was chosen (golden.safetensors keeps
// them at different offsets for the tiny models and the demo model).
std::vector<float> GoldenRowBefore(const GoldenTensors& golden, const std::string& model, int p, int k) {
  const std::string key = "prompt_" + std::to_string(p);
  Tensor rows;
  int64_t row = k;
  if (model == "lamina-demo-6m") {
    rows = golden.Float(key + ".greedy_logits");
  } else if (k == 0) {
    rows = golden.Float(key + ".prefill_logits");
    row = rows.dim(0) - 1;
  } else {
    rows = golden.Float(key + ".greedy_logits");
    row = k - 1;
  }
  return std::vector<float>(rows.row(row), rows.row(row) + rows.dim(1));
}

std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  double max = -INFINITY, sum = 0.0;
  for (float v : logits) max = std::max<double>(max, v);
  for (float v : logits) sum += std::exp(v - max);
  std::vector<double> out;
  for (float v : logits) out.push_back(v - max - std::log(sum));
  return out;
}

TEST_P(LocalClusterGoldenTest, LogprobsAreTheLogSoftmaxOfTheGoldenLogits) {
  auto cluster = LocalCluster::Load(ModelDir(GetParam()));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // A float32 KV cache for the demo model too (a bfloat16 one moves its logits by up to 2e-2
  // relative, the fixtures' bound, which tells nothing of the log probabilities' own accuracy).
  ASSERT_TRUE((*cluster)->SetKvDtype("float32").ok());
  GoldenTensors golden(GetParam());
  const double tolerance = 1e-4;  // about 10x the largest error seen (9e-6, tiny-llama3)
  GenerationRequest r = Greedy(golden.Ids("prompt_0.ids"), 0);
  const std::vector<int32_t> greedy = golden.Ids("prompt_0.greedy_ids");
  r.max_tokens = static_cast<int32_t>(greedy.size());
  r.sampling.top_logprobs = 5;
  std::vector<int32_t> ids;
  double worst = 0.0;
  ASSERT_TRUE((*cluster)
                  ->Generate({&r, 1},
                             [&](const TokenEvent& e) {
                               const int k = static_cast<int>(ids.size());
                               ids.push_back(e.token);
                               ASSERT_NE(e.logprobs, nullptr);
                               const std::vector<double> want = LogSoftmax(GoldenRowBefore(golden, GetParam(), 0, k));
                               EXPECT_NEAR(e.logprobs->logprob, want[e.token], tolerance) << "token " << k;
                               worst = std::max(worst, std::fabs(e.logprobs->logprob - want[e.token]));
                               ASSERT_EQ(e.logprobs->top_count, 5);
                               EXPECT_EQ(e.logprobs->top_ids[0], e.token) << "greedy takes the most likely";
                               for (int32_t j = 0; j < 5; ++j) {
                                 EXPECT_NEAR(e.logprobs->top_logprobs[j], want[e.logprobs->top_ids[j]], tolerance)
                                     << "token " << k << ", rank " << j;
                                 if (j > 0) {
                                   EXPECT_LE(e.logprobs->top_logprobs[j], e.logprobs->top_logprobs[j - 1]);
                                 }
                               }
                             })
                  .ok());
  EXPECT_EQ(ids, greedy);
  std::printf("%s: largest logprob error against the golden logits %.2e\n", GetParam().c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(AllModels, LocalClusterGoldenTest,
                         ::testing::Values("tiny-llama2", "tiny-llama3", "lamina-demo-6m"));

TEST(LocalClusterTest, StopsAtEndOfSequenceUnlessIgnored) {
  auto cluster = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  GoldenTensors golden("lamina-demo-6m");
  std::vector<int32_t> greedy = golden.Ids("prompt_0.greedy_ids");
  // Make the 5th greedy token a stop id: generation ends right after emitting it.
  GenerationRequest r = Greedy(golden.Ids("prompt_0.ids"), 48);
  r.stop_ids = {greedy[4]};
  std::vector<Output> out = GenerateAll(**cluster, {r});
  EXPECT_EQ(out[0].finish, FinishReason::kStopId);
  EXPECT_EQ(out[0].ids, std::vector<int32_t>(greedy.begin(), greedy.begin() + 5));
}

// A stop string ends a sample once its text holds one: the events' text is the golden text up to
// the stop string (as the cluster's API gives it, ClusterTest.StopStringsEndGenerationBeforeTheStopText), and
// the last event says why. Text that merely begins like a stop string is held back, then shown.
// Without stop strings, the events' text is the whole golden text.
TEST(LocalClusterTest, StopStringsEndASampleAndItsTextBeforeThem) {
  auto cluster = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  nlohmann::json golden = LoadGoldenJson("lamina-demo-6m");
  const std::string full = golden["prompts"][3]["greedy_text"];
  struct Case {
    std::vector<std::string> stops;
    std::string text;
    FinishReason finish;
  };
  const Case cases[] = {
      {{"efficiency"},
       " introduce attention offloading, an innovative architectural approach to improve the cost ",
       FinishReason::kStopString},
      {{"effi-ciency", "", "approach"},
       " introduce attention offloading, an innovative architectural ",
       FinishReason::kStopString},
      {{}, full, FinishReason::kMaxTokens},
      {{"offloading, an ibex"}, full, FinishReason::kMaxTokens},  // its start is held back, then shown
  };
  for (const Case& c : cases) {
    GenerationRequest r = Greedy((*cluster)->tokenizer().EncodePrompt("In this paper, we"), 48);
    r.stop_strings = c.stops;
    std::string text;
    FinishReason finish = FinishReason::kNone;
    int tokens = 0;
    ASSERT_TRUE((*cluster)
                    ->Generate({&r, 1},
                               [&](const TokenEvent& e) {
                                 text += e.text;
                                 finish = e.finish;
                                 ++tokens;
                               })
                    .ok());
    EXPECT_EQ(text, c.text) << "stops: " << ::testing::PrintToString(c.stops);
    EXPECT_EQ(finish, c.finish) << "stops: " << ::testing::PrintToString(c.stops);
    if (c.finish == FinishReason::kStopString) {
      EXPECT_LT(tokens, 48);
    }
  }
}

TEST(LocalClusterTest, SeededSamplingIsReproducibleAndDiffersFromGreedy) {
  auto cluster = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // The demo model all but memorised its training text; "We" leaves it real choices.
  GenerationRequest r = Greedy((*cluster)->tokenizer().EncodePrompt("We"), 32);
  r.sampling = {1.5f, 50, 0.95f, 1234};
  std::vector<Output> a = GenerateAll(**cluster, {r, r});
  std::vector<Output> b = GenerateAll(**cluster, {r});
  EXPECT_EQ(a[0].ids, b[0].ids);
  EXPECT_EQ(a[1].ids, b[0].ids);
  std::vector<Output> greedy = GenerateAll(**cluster, {Greedy(r.prompt, 32)});
  EXPECT_NE(a[0].ids, greedy[0].ids);
}

TEST(LocalClusterTest, SampleKOfAnNRequestEqualsASingleRequestWithSeedPlusK) {
  auto cluster = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  GenerationRequest r = Greedy((*cluster)->tokenizer().EncodePrompt("We"), 24);
  r.sampling = {1.2f, 0, 1.0f, 40};
  r.n = 3;
  std::map<int32_t, std::vector<int32_t>> samples;
  ASSERT_TRUE((*cluster)->Generate({&r, 1}, [&](const TokenEvent& e) { samples[e.sample].push_back(e.token); }).ok());
  ASSERT_EQ(samples.size(), 3u);
  for (int32_t k = 0; k < 3; ++k) {
    GenerationRequest single = r;
    single.n = 1;
    single.sampling.seed = 40 + k;
    EXPECT_EQ(GenerateAll(**cluster, {single})[0].ids, samples[k]) << "sample " << k;
  }
  EXPECT_NE(samples[0], samples[1]);
}

TEST(LocalClusterTest, AskingForLogprobsChangesNoTokenAndOnlyThoseWhoAskGetThem) {
  auto cluster = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  GenerationRequest plain = Greedy((*cluster)->tokenizer().EncodePrompt("We"), 24);
  plain.sampling = {1.3f, 40, 0.9f, 77};
  GenerationRequest asking = plain;
  asking.sampling.logprobs = true;  // no alternatives
  std::vector<std::vector<int32_t>> ids(2);
  std::vector<int> with_logprobs(2, 0);
  ASSERT_TRUE((*cluster)
                  ->Generate({plain, asking},
                             [&](const TokenEvent& e) {
                               ids[e.request].push_back(e.token);
                               if (e.logprobs == nullptr) return;
                               ++with_logprobs[e.request];
                               EXPECT_LE(e.logprobs->logprob, 0.0f);
                               EXPECT_EQ(e.logprobs->top_count, 0);
                             })
                  .ok());
  EXPECT_EQ(ids[0], ids[1]);
  EXPECT_EQ(with_logprobs[0], 0);
  EXPECT_EQ(with_logprobs[1], 24);
  EXPECT_EQ(GenerateAll(**cluster, {plain})[0].ids, ids[0]);
}

// Each of n samples gets its own tokens' log probabilities, those a single request with its seed
// gets.
TEST(LocalClusterTest, EachSampleOfAnNRequestGetsItsOwnLogprobs) {
  auto cluster = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  GenerationRequest r = Greedy((*cluster)->tokenizer().EncodePrompt("We"), 10);
  r.sampling = {1.2f, 0, 1.0f, 40, true, 2};
  r.n = 2;
  auto collect = [&](const GenerationRequest& request) {
    std::map<int32_t, std::vector<float>> logprobs;  // sample -> the drawn tokens' log probabilities
    EXPECT_TRUE((*cluster)
                    ->Generate({&request, 1},
                               [&](const TokenEvent& e) {
                                 ASSERT_NE(e.logprobs, nullptr);
                                 EXPECT_EQ(e.logprobs->top_count, 2);
                                 logprobs[e.sample].push_back(e.logprobs->logprob);
                               })
                    .ok());
    return logprobs;
  };
  const auto both = collect(r);
  ASSERT_EQ(both.size(), 2u);
  EXPECT_NE(both.at(0), both.at(1));
  for (int32_t k = 0; k < 2; ++k) {
    GenerationRequest single = r;
    single.n = 1;
    single.sampling.seed = 40 + k;
    const std::vector<float> alone = collect(single).at(0);
    ASSERT_EQ(alone.size(), both.at(k).size()) << "sample " << k;
    for (size_t t = 0; t < alone.size(); ++t) {
      // A batch of two and a batch of one may round the matmuls apart.
      EXPECT_NEAR(alone[t], both.at(k)[t], 1e-4) << "sample " << k << ", token " << t;
    }
  }
}

TEST(LocalClusterTest, StopsWhenTheContextIsFull) {
  auto cluster = LocalCluster::Load(ModelDir("tiny-llama2"));  // context 512
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  GenerationRequest r = Greedy(std::vector<int32_t>(508, 300), 100);
  std::vector<Output> out = GenerateAll(**cluster, {r});
  EXPECT_EQ(out[0].finish, FinishReason::kContextFull);
  // Sampled after positions 507 (prefill), 508, 509, 510 and 511; the 5th has no position left.
  EXPECT_EQ(out[0].ids.size(), 5u);
}

TEST(LocalClusterTest, BadRequestsAreRejectedBeforeAnyWorkNamingTheRequest) {
  auto cluster = LocalCluster::Load(ModelDir("tiny-llama3"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto status_of = [&](std::vector<GenerationRequest> requests) {
    return (*cluster)->Generate(requests, [](const TokenEvent&) { FAIL() << "no token expected"; });
  };
  GenerationRequest good = Greedy({509, 40}, 4);
  GenerationRequest too_long = Greedy(std::vector<int32_t>(1024, 40), 4);
  absl::Status s = status_of({good, too_long});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("request 2: the prompt has 1024 tokens; the model's context is 1024"), std::string::npos) << s;
  EXPECT_NE(status_of({Greedy({}, 4)}).message().find("empty"), std::string::npos);
  EXPECT_NE(status_of({Greedy({512}, 4)}).message().find("token id 512 is outside the vocabulary"), std::string::npos);
  GenerationRequest bad_sampling = good;
  bad_sampling.sampling.top_p = 2.0f;
  EXPECT_NE(status_of({bad_sampling}).message().find("top_p"), std::string::npos);
}

}  // namespace
}  // namespace lamina
