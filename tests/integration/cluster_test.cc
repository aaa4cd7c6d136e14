// The cluster as users run it: `lamina up` starts a coordinator, a compute node and memory nodes
// as separate processes on loopback; requests go through the public gRPC API.
#include <signal.h>

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/transport/transport.h"
#include "coordinator/embedded/local_cluster.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "lamina/v1/generation.grpc.pb.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/requests_in_flight.h"
#include "tests/integration/single_process.h"
#include "tests/support/golden.h"

namespace lamina::testing {
namespace {

TEST(ClusterTest, ThirtyTwoConcurrentRequestsMatchSingleProcessModeOnBothMemoryNodes) {
  auto cluster = ClusterHarness::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok()) << local.status();

  const std::vector<std::string> texts = {"Attention offloading", "The memory devices", "FlashAttention",
                                          "In this paper, we", "We", "The KV cache", "Decode attention is",
                                          "GPU memory"};
  nlohmann::json golden = LoadGoldenJson("lamina-demo-6m");
  std::vector<lamina::v1::GenerateRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 32; ++i) {
    const std::string& text = texts[i % texts.size()];
    const int max_tokens = 8 + (i * 7) % 41;  // 8 .. 48
    const std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt(text);
    lamina::v1::GenerateRequest r = IdsRequest(prompt, max_tokens);
    if (i % 2 == 0) {  // half the requests send text, tokenized by the cluster
      r.clear_token_ids();
      r.set_text(text);
    }
    requests.push_back(r);
    expected.push_back(SingleProcessIds(**local, prompt, max_tokens));
  }
  // The golden fixture agrees with single-process mode where it applies.
  for (int p = 0; p < 4; ++p) {
    std::vector<int32_t> greedy = golden["prompts"][p]["greedy_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(SingleProcessIds(**local, golden["prompts"][p]["ids"].get<std::vector<int32_t>>(), 48), greedy);
  }

  std::atomic<bool> done{false};
  std::map<std::string, int64_t> max_sequences;
  std::thread watcher([&] {
    while (!done) {
      auto status = (*cluster)->client().Status(absl::Seconds(1));
      if (status.ok()) {
        for (const auto& n : status->nodes()) {
          max_sequences[n.name()] = std::max(max_sequences[n.name()], n.num_sequences());
        }
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  std::vector<Outcome> outcomes = GenerateConcurrently((*cluster)->client(), requests);
  done = true;
  watcher.join();

  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << "request " << i << ": " << outcomes[i].status;
    EXPECT_EQ(outcomes[i].ids, expected[i]) << "request " << i;
    EXPECT_EQ(outcomes[i].finish, lamina::v1::FINISH_REASON_LENGTH);
  }
  // Request 3 is "In this paper, we", sent as ids: its streamed text starts the golden text.
  ASSERT_EQ(texts[3], golden["prompts"][3]["text"].get<std::string>());
  EXPECT_FALSE(outcomes[3].text.empty());
  EXPECT_EQ(outcomes[3].text, golden["prompts"][3]["greedy_text"].get<std::string>().substr(0, outcomes[3].text.size()));
  EXPECT_GT(max_sequences["memory-0"], 0) << "memory-0 never held a sequence";
  EXPECT_GT(max_sequences["memory-1"], 0) << "memory-1 never held a sequence";
}

TEST(ClusterTest, CancellingAStreamFreesItsSlotsVisiblyInStatus) {
  auto cluster = ClusterHarness::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto channel = grpc::CreateChannel((*cluster)->endpoint(), grpc::InsecureChannelCredentials());
  auto stub = lamina::v1::Generation::NewStub(channel);
  grpc::ClientContext context;
  lamina::v1::GenerateRequest request;
  request.set_text("In this paper, we");
  request.set_max_tokens(1000);
  request.set_ignore_eos(true);
  auto reader = stub->Generate(&context, request);
  lamina::v1::GenerateResponse response;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(reader->Read(&response));

  auto used = [&] {
    int64_t total = 0;
    auto status = (*cluster)->client().Status(absl::Seconds(1));
    for (const auto& n : status->nodes()) total += n.kv_used_slots();
    return total;
  };
  // Memory nodes report their use with each heartbeat (every 100 ms here).
  absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (used() < 20 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_GE(used(), 20) << "the running request should hold its prompt and generated tokens";

  context.TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  deadline = absl::Now() + absl::Seconds(3);
  while (used() != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(used(), 0) << "cancelling must free the request's KV slots";
  absl::StatusOr<lamina::v1::ClusterStatusResponse> status = (*cluster)->client().Status(absl::Seconds(1));
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->cancelled(), 1) << "a cancelled request is not a failure";
  EXPECT_EQ(status->failed(), 0);
}

// vLLM's min_tokens: the stop id greedy decoding meets third cannot be drawn before the sixth
// token, nor can a stop string end the text before it.
TEST(ClusterTest, MinTokensHoldsBackStopIdsAndStringsUntilEnoughAreGenerated) {
  auto cluster = ClusterHarness::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  lamina::v1::GenerateRequest request;
  request.set_text("In this paper, we");
  request.set_max_tokens(12);
  const Outcome greedy = Generate((*cluster)->client(), request);
  ASSERT_TRUE(greedy.status.ok()) << greedy.status;
  ASSERT_EQ(greedy.ids.size(), 12u);

  request.add_stop_token_ids(greedy.ids[2]);
  const Outcome stopped = Generate((*cluster)->client(), request);
  ASSERT_TRUE(stopped.status.ok()) << stopped.status;
  EXPECT_EQ(stopped.ids, std::vector<int32_t>(greedy.ids.begin(), greedy.ids.begin() + 3));
  EXPECT_EQ(stopped.finish, lamina::v1::FINISH_REASON_STOP);

  request.mutable_sampling()->set_min_tokens(6);
  const Outcome held = Generate((*cluster)->client(), request);
  ASSERT_TRUE(held.status.ok()) << held.status;
  ASSERT_GE(held.ids.size(), 6u);
  EXPECT_EQ(std::vector<int32_t>(held.ids.begin(), held.ids.begin() + 2),
            std::vector<int32_t>(greedy.ids.begin(), greedy.ids.begin() + 2));
  for (size_t i = 0; i < 6; ++i) EXPECT_NE(held.ids[i], greedy.ids[2]) << "token " << i;

  // A stop string in the first tokens' text does not count before min_tokens.
  lamina::v1::GenerateRequest strings;
  strings.set_text("In this paper, we");
  strings.set_max_tokens(12);
  strings.add_stop_strings(greedy.text.substr(0, 3));
  const Outcome early = Generate((*cluster)->client(), strings);
  ASSERT_TRUE(early.status.ok());
  EXPECT_EQ(early.finish, lamina::v1::FINISH_REASON_STOP);
  EXPECT_LT(early.ids.size(), 3u);
  strings.mutable_sampling()->set_min_tokens(8);
  const Outcome late = Generate((*cluster)->client(), strings);
  ASSERT_TRUE(late.status.ok());
  EXPECT_GE(late.ids.size(), 8u);
  EXPECT_EQ(late.ids, std::vector<int32_t>(greedy.ids.begin(), greedy.ids.begin() + late.ids.size()));

  request.mutable_sampling()->set_min_tokens(13);  // beyond max_tokens
  EXPECT_EQ(Generate((*cluster)->client(), request).status.code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClusterTest, StatusShowsWhatThePrefixCacheKeepsApartFromRequests) {
  auto cluster = ClusterHarness::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::string prompt;
  for (int i = 0; i < 12; ++i) prompt += "Attention offloading keeps the KV cache on memory nodes. ";
  lamina::v1::GenerateRequest request;
  request.set_text(prompt);
  request.set_max_tokens(4);
  Outcome outcome = Generate((*cluster)->client(), request);
  ASSERT_TRUE(outcome.status.ok()) << outcome.status;
  // Idle now: what the pools hold is the prefix cache's, reported apart (heartbeats every 100 ms).
  int64_t cached = 0, busy = -1;
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (absl::Now() < deadline && (cached == 0 || busy != 0)) {
    absl::StatusOr<lamina::v1::ClusterStatusResponse> status = (*cluster)->client().Status(absl::Seconds(1));
    ASSERT_TRUE(status.ok());
    cached = 0;
    busy = 0;
    for (const auto& n : status->nodes()) {
      cached += n.kv_cached_slots();
      busy += (n.kv_used_slots() - n.kv_cached_slots()) + (n.num_sequences() - n.cached_sequences());
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_GT(cached, 0) << "the prompt's whole blocks stay cached";
  EXPECT_EQ(busy, 0) << "no request holds anything";
  auto [code, out] = RunCli("status --endpoint " + (*cluster)->endpoint());
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find(absl::StrCat("0 / 8192 (", 8192 - cached)), std::string::npos) << out;
  EXPECT_NE(out.find(" cached"), std::string::npos) << out;
  // The paces balanced placement goes by: the memory nodes' attention per row, the compute node's step.
  EXPECT_NE(out.find(" us/row"), std::string::npos) << out;
  EXPECT_NE(out.find(" ms/step"), std::string::npos) << out;
}

TEST(ClusterTest, NSamplesStoreThePromptOnceAndEachEqualsASingleRequestWithItsSeed) {
  ClusterOptions options;
  options.memory_nodes = 1;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok());
  // A long prompt makes sharing visible: stored four times it would take 4 x its length.
  std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt(
      "Attention offloading moves the KV cache to memory devices. The memory devices hold the KV cache "
      "and run attention, while compute devices run the rest of the model. In this paper, we");
  ASSERT_GT(prompt.size(), 30u);
  lamina::v1::GenerateRequest r = IdsRequest(prompt, 400);
  r.set_n(4);
  r.mutable_sampling()->set_temperature(1.1f);
  r.mutable_sampling()->set_seed(11);

  std::atomic<bool> done{false};
  int64_t max_shared = 0, used_when_shared = 0;
  std::thread watcher([&] {
    while (!done) {
      auto status = (*cluster)->client().Status(absl::Seconds(1));
      if (status.ok()) {
        for (const auto& n : status->nodes()) {
          // The most shared slots, and the fullest pool seen with them: a snapshot between the
          // forks and the first decode step holds the prompt alone.
          if (n.name() == "memory-0" && (n.kv_shared_slots() > max_shared ||
                                         (n.kv_shared_slots() == max_shared && n.kv_used_slots() > used_when_shared))) {
            max_shared = n.kv_shared_slots();
            used_when_shared = n.kv_used_slots();
          }
        }
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  });
  std::map<int32_t, std::vector<int32_t>> samples;
  int finished = 0;
  absl::Status status = (*cluster)->client().Generate(r, [&](const lamina::v1::GenerateResponse& resp) {
    auto& ids = samples[resp.index()];
    ids.insert(ids.end(), resp.token_ids().begin(), resp.token_ids().end());
    finished += resp.finish_reason() != lamina::v1::FINISH_REASON_UNSPECIFIED;
  });
  done = true;
  watcher.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(finished, 4);
  ASSERT_EQ(samples.size(), 4u);
  EXPECT_EQ(max_shared, static_cast<int64_t>(prompt.size())) << "the prompt's slots are held by all four samples";
  // Stored once, the pool holds the prompt plus the same number of tokens for each sample (they
  // advance together); the memory node reports a consistent snapshot.
  EXPECT_EQ((used_when_shared - static_cast<int64_t>(prompt.size())) % 4, 0) << used_when_shared;
  EXPECT_GE(used_when_shared, static_cast<int64_t>(prompt.size()) + 4);
  for (int32_t k = 0; k < 4; ++k) {
    GenerationRequest single;
    single.prompt = prompt;
    single.max_tokens = 400;
    single.ignore_eos = true;
    single.sampling = {1.1f, 0, 1.0f, static_cast<uint64_t>(11 + k)};
    std::vector<int32_t> expected;
    ASSERT_TRUE((*local)->Generate({&single, 1}, [&](const TokenEvent& e) { expected.push_back(e.token); }).ok());
    EXPECT_EQ(samples[k], expected) << "sample " << k;
  }
}

// Requests sharing a long system prompt reuse its slots, produce the outputs they produce without
// sharing, and see their first token sooner.
TEST(ClusterTest, ASharedSystemPromptIsReusedWithIdenticalOutputsAndOnlyTheRestPrefilled) {
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok());
  std::string system;
  while (system.size() < 1800) {
    system += "Attention offloading moves the KV cache to cheap memory devices, which run attention, while the "
              "expensive compute devices run the rest of the model. ";
  }
  const std::vector<int32_t> first = (*local)->tokenizer().EncodePrompt(system + "Question one: why?");
  const std::vector<int32_t> second = (*local)->tokenizer().EncodePrompt(system + "Question two: how?");
  ASSERT_GT(second.size(), 300u);
  ASSERT_LT(second.size(), 900u);
  // Long enough that a request holds the shared slots across several heartbeats, which is how
  // the memory node's shared count reaches `lamina status`.
  constexpr int kOutputTokens = 160;
  const std::vector<int32_t> expected = SingleProcessIds(**local, second, kOutputTokens);

  struct Timed {
    Outcome outcome;
    double ttft_ms;
  };
  auto run = [](ClusterHarness& cluster, const std::vector<int32_t>& prompt) {
    Timed t{{}, -1};
    const absl::Time start = absl::Now();
    t.outcome.status = cluster.client().Generate(IdsRequest(prompt, kOutputTokens),
                                                 [&](const lamina::v1::GenerateResponse& r) {
      if (t.ttft_ms < 0) t.ttft_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
      t.outcome.ids.insert(t.outcome.ids.end(), r.token_ids().begin(), r.token_ids().end());
    });
    return t;
  };
  // Three runs of the second prompt; returns their median time to first token (printed, not
  // asserted: speed is for benchmarks) and adds the prompt tokens the cluster prefilled for them.
  auto median_ttft = [&](ClusterHarness& cluster, std::vector<Timed>* runs, int64_t* prefilled) {
    auto before = cluster.client().Status(absl::Seconds(5));
    EXPECT_TRUE(before.ok()) << before.status();
    for (int i = 0; i < 3; ++i) runs->push_back(run(cluster, second));
    auto after = cluster.client().Status(absl::Seconds(5));
    EXPECT_TRUE(after.ok()) << after.status();
    if (before.ok() && after.ok()) *prefilled = after->prefilled_tokens() - before->prefilled_tokens();
    std::vector<double> ttft;
    for (const Timed& t : *runs) ttft.push_back(t.ttft_ms);
    std::sort(ttft.begin(), ttft.end());
    return ttft[1];
  };

  ClusterOptions without_sharing;
  without_sharing.memory_nodes = 1;
  without_sharing.prefix_caching = false;
  double cold_ttft;
  int64_t cold_prefilled = -1;
  {
    auto cluster = ClusterHarness::Start(without_sharing);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    ASSERT_TRUE(run(**cluster, first).outcome.status.ok());
    std::vector<Timed> runs;
    cold_ttft = median_ttft(**cluster, &runs, &cold_prefilled);
    for (const Timed& t : runs) EXPECT_EQ(t.outcome.ids, expected);
  }

  ClusterOptions with_sharing = without_sharing;
  with_sharing.prefix_caching = true;
  auto cluster = ClusterHarness::Start(with_sharing);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Timed warm = run(**cluster, first);  // fills the cache with the system prompt
  ASSERT_TRUE(warm.outcome.status.ok()) << warm.outcome.status;

  std::atomic<bool> done{false};
  int64_t max_shared = 0;
  std::thread watcher([&] {
    while (!done) {
      auto status = (*cluster)->client().Status(absl::Seconds(1));
      if (status.ok()) {
        for (const auto& n : status->nodes()) max_shared = std::max(max_shared, n.kv_shared_slots());
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  std::vector<Timed> runs;
  int64_t warm_prefilled = -1;
  const double warm_ttft = median_ttft(**cluster, &runs, &warm_prefilled);
  done = true;
  watcher.join();
  for (const Timed& t : runs) {
    ASSERT_TRUE(t.outcome.status.ok()) << t.outcome.status;
    EXPECT_EQ(t.outcome.ids, expected) << "sharing must not change the output";
  }
  // The shared part is the prompts' common whole blocks (16 tokens each).
  int64_t common = 0;
  while (common < static_cast<int64_t>(first.size()) && first[common] == second[common]) ++common;
  EXPECT_GE(max_shared, common / 16 * 16 - 16) << "the system prompt's slots are shared, not stored again";
  // Without the cache every run prefills the whole prompt; with it only what follows the shared
  // blocks.
  const int64_t prompt = static_cast<int64_t>(second.size());
  EXPECT_EQ(cold_prefilled, 3 * prompt);
  EXPECT_GE(warm_prefilled, 3);
  EXPECT_LE(warm_prefilled, 3 * (prompt - (common / 16 * 16 - 16))) << "of " << 3 * prompt << " prompt tokens";
  std::printf("time to first token for a %zu-token prompt: %.1f ms with the cached system prompt, %.1f ms without\n",
              second.size(), warm_ttft, cold_ttft);
}

// Prompts longer than an iteration's token budget are prefilled a budget's worth at a time, beside
// the running sequences' decodes, and give the outputs they give whole: greedy or sampled, with n
// samples forked after the last chunk, and continuing a cached prefix.
TEST(ClusterTest, LongPromptsArePrefilledInChunksWithIdenticalOutputs) {
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok());
  std::string text;
  while (text.size() < 1000) {
    text +=
        "Attention offloading moves the KV cache to cheap memory devices, which run attention, while the "
        "expensive compute devices run the rest of the model. ";
  }
  const std::vector<int32_t> long_a = (*local)->tokenizer().EncodePrompt(text + "Question one: why?");
  const std::vector<int32_t> long_b = (*local)->tokenizer().EncodePrompt(text + "Question two: how?");
  ASSERT_GT(long_a.size(), 150u);
  ASSERT_LT(long_a.size(), 600u);
  const std::vector<int32_t> short_prompt = (*local)->tokenizer().EncodePrompt("We");
  constexpr int kBudget = 48;
  ClusterOptions options;
  options.max_tokens_per_iteration = kBudget;

  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  {
    // Alone, a prompt of P tokens takes ceil(P / budget) steps before its first token, each
    // prefilling at most the budget, then a step per further token.
    constexpr int kTokens = 4;
    auto before = (*cluster)->client().Status(absl::Seconds(5));
    ASSERT_TRUE(before.ok()) << before.status();
    std::vector<Outcome> alone = GenerateConcurrently((*cluster)->client(), {IdsRequest(long_a, kTokens)});
    ASSERT_TRUE(alone[0].status.ok()) << alone[0].status;
    EXPECT_EQ(alone[0].ids, SingleProcessIds(**local, long_a, kTokens));
    auto after = (*cluster)->client().Status(absl::Seconds(5));
    ASSERT_TRUE(after.ok()) << after.status();
    const int64_t prompt = static_cast<int64_t>(long_a.size());
    EXPECT_EQ(after->prefilled_tokens() - before->prefilled_tokens(), prompt);
    EXPECT_EQ(after->iterations() - before->iterations(), (prompt + kBudget - 1) / kBudget + kTokens - 1);
  }

  // Together: a short prompt decoding while the long ones are prefilled in chunks (one sampled),
  // the second long prompt sharing the first one's cached blocks, then two samples of one prompt.
  std::vector<lamina::v1::GenerateRequest> requests = {IdsRequest(short_prompt, 120), IdsRequest(long_a, 40),
                                                       IdsRequest(long_b, 40), IdsRequest(long_b, 40)};
  std::vector<std::vector<int32_t>> expected = {SingleProcessIds(**local, short_prompt, 120),
                                                SingleProcessIds(**local, long_a, 40),
                                                SingleProcessIds(**local, long_b, 40)};
  requests[3].mutable_sampling()->set_temperature(1.0f);
  requests[3].mutable_sampling()->set_seed(5);
  auto sampled = [&](const std::vector<int32_t>& prompt, uint64_t seed) {
    GenerationRequest single;
    single.prompt = prompt;
    single.max_tokens = 40;
    single.ignore_eos = true;
    single.sampling = {1.0f, 0, 1.0f, seed};
    std::vector<int32_t> ids;
    EXPECT_TRUE((*local)->Generate({&single, 1}, [&](const TokenEvent& e) { ids.push_back(e.token); }).ok());
    return ids;
  };
  expected.push_back(sampled(long_b, 5));
  std::vector<Outcome> outcomes = GenerateConcurrently((*cluster)->client(), requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << "request " << i << ": " << outcomes[i].status;
    EXPECT_EQ(outcomes[i].ids, expected[i]) << "request " << i;
  }

  lamina::v1::GenerateRequest two = IdsRequest(long_a, 40);
  two.set_n(2);
  two.mutable_sampling()->set_temperature(1.0f);
  two.mutable_sampling()->set_seed(21);
  std::map<int32_t, std::vector<int32_t>> samples;
  absl::Status status = (*cluster)->client().Generate(two, [&](const lamina::v1::GenerateResponse& r) {
    auto& ids = samples[r.index()];
    ids.insert(ids.end(), r.token_ids().begin(), r.token_ids().end());
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(samples[0], sampled(long_a, 21));
  EXPECT_EQ(samples[1], sampled(long_a, 22));
}

TEST(ClusterTest, GrpcRequestsAreBoundedAsHttpOnesAre) {
  auto cluster = ClusterHarness::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto refused = [&](const lamina::v1::GenerateRequest& request, const std::string& expected) {
    const absl::Time start = absl::Now();
    const Outcome outcome = Generate((*cluster)->client(), request);
    EXPECT_EQ(outcome.status.code(), absl::StatusCode::kInvalidArgument) << outcome.status;
    EXPECT_NE(outcome.status.message().find(expected), std::string::npos) << outcome.status;
    // Sending 200 MB takes a second or two; tokenizing them took 16.7 s.
    EXPECT_LT(absl::Now() - start, absl::Seconds(8)) << "refused only after working on it";
  };
  lamina::v1::GenerateRequest base;
  base.set_text("In this paper, we");
  base.set_max_tokens(4);
  lamina::v1::GenerateRequest r = base;
  r.set_n(-1);
  refused(r, "n: must be from 1 to 64, got -1");
  r = base;
  r.add_stop_token_ids(-5);
  refused(r, "stop_token_ids: -5 is outside the vocabulary");
  r = base;
  for (int i = 0; i < 1000000; ++i) r.add_stop_strings("x");
  refused(r, "stop_strings: 1000000 strings; at most 16");
  r = base;
  r.set_text(std::string(200 << 20, 'a'));  // 200 MB: was tokenized for 16.7 s before
  refused(r, "text: 209715200 bytes; at most 65536");
  Outcome ok = Generate((*cluster)->client(), base);
  EXPECT_TRUE(ok.status.ok()) << ok.status;
}

TEST(ClusterTest, StopStringsEndGenerationBeforeTheStopText) {
  ClusterOptions options;
  options.memory_nodes = 1;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  lamina::v1::GenerateRequest r;
  r.set_text("In this paper, we");
  r.set_max_tokens(48);
  r.add_stop_strings("efficiency");
  Outcome o = Generate((*cluster)->client(), r);
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.text, " introduce attention offloading, an innovative architectural approach to improve the cost ");
  EXPECT_EQ(o.finish, lamina::v1::FINISH_REASON_STOP);
}

// `lamina generate --endpoint` says on stderr which completion the model's context cut short of
// --max-tokens, and prints the tokens that fit.
TEST(ClusterTest, TheCliNamesACompletionThatTheContextCutShort) {
  ClusterOptions options;
  options.memory_nodes = 1;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string long_prompt = absl::StrJoin(std::vector<std::string>(1000, "40"), ",");
  auto [code, out] = RunCli("generate --endpoint " + (*cluster)->endpoint() + " --prompt-ids 7,8 --prompt-ids " +
                            long_prompt + " --max-tokens 100 --ignore-eos --print-ids");
  ASSERT_EQ(code, 0) << out;
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << out;
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(lines[0], ' ')).size(), 100u);
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(lines[1], ' ')).size(),
            25u);  // 1024 - 1000, and the last one drawn
  EXPECT_EQ(lines[2], "lamina generate: prompt 2 stopped before --max-tokens: the model's context is full");
}

// Log probabilities come with each token when asked, through the gRPC API with each token's text,
// and equal single-process mode's; asking changes no token; a bad top_logprobs is refused.
TEST(ClusterTest, LogprobsComeWithEachTokenAndEqualSingleProcessModes) {
  ClusterOptions options;
  options.memory_nodes = 1;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok()) << local.status();
  const Tokenizer& tokenizer = (*local)->tokenizer();

  const std::vector<int32_t> prompt = tokenizer.EncodePrompt("We");
  std::vector<GenerationRequest> singles(3);
  std::vector<lamina::v1::GenerateRequest> requests;
  for (int i = 0; i < 3; ++i) {
    singles[i].prompt = prompt;
    singles[i].max_tokens = 12;
    singles[i].ignore_eos = true;
    lamina::v1::GenerateRequest r = IdsRequest(prompt, 12);
    if (i > 0) {  // sampled
      singles[i].sampling = {1.2f, 0, 1.0f, 5};
      r.mutable_sampling()->set_temperature(1.2f);
      r.mutable_sampling()->set_seed(5);
    }
    if (i < 2) {  // 0: greedy with 3 alternatives; 1: sampled, the token's own only; 2: none
      singles[i].sampling.logprobs = true;
      singles[i].sampling.top_logprobs = i == 0 ? 3 : 0;
      r.mutable_sampling()->set_logprobs(true);
      r.mutable_sampling()->set_top_logprobs(singles[i].sampling.top_logprobs);
    }
    requests.push_back(r);
  }
  std::vector<std::vector<int32_t>> ids(3);
  std::vector<std::vector<TokenLogprobs>> want(3);
  ASSERT_TRUE((*local)
                  ->Generate(singles,
                             [&](const TokenEvent& e) {
                               ids[e.request].push_back(e.token);
                               if (e.logprobs != nullptr) want[e.request].push_back(*e.logprobs);
                             })
                  .ok());
  const std::vector<Outcome> outcomes = GenerateConcurrently((*cluster)->client(), requests);
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(::testing::Message() << "request " << i);
    ASSERT_TRUE(outcomes[i].status.ok()) << outcomes[i].status;
    EXPECT_EQ(outcomes[i].ids, ids[i]);
    ASSERT_EQ(outcomes[i].logprobs.size(), want[i].size());
    for (size_t t = 0; t < want[i].size(); ++t) {
      const lamina::v1::TokenLogprobs& got = outcomes[i].logprobs[t];
      EXPECT_NEAR(got.logprob(), want[i][t].logprob, 1e-5) << "token " << t;
      EXPECT_EQ(got.token(), tokenizer.TokenText(ids[i][t])) << "token " << t;
      ASSERT_EQ(got.top_size(), want[i][t].top_count) << "token " << t;
      for (int k = 0; k < got.top_size(); ++k) {
        EXPECT_EQ(got.top(k).token_id(), want[i][t].top_ids[k]) << "token " << t << ", rank " << k;
        EXPECT_NEAR(got.top(k).logprob(), want[i][t].top_logprobs[k], 1e-5) << "token " << t << ", rank " << k;
        EXPECT_EQ(got.top(k).token(), tokenizer.TokenText(got.top(k).token_id()));
      }
    }
  }
  EXPECT_EQ(outcomes[0].logprobs.size(), 12u);
  EXPECT_EQ(outcomes[1].ids, outcomes[2].ids);  // asking changed nothing
  EXPECT_TRUE(outcomes[2].logprobs.empty());

  lamina::v1::GenerateRequest bad = IdsRequest(prompt, 4);
  bad.mutable_sampling()->set_top_logprobs(21);
  const Outcome refused = Generate((*cluster)->client(), bad);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status.message().find("top_logprobs must be from 0 to 20, got 21"), std::string::npos)
      << refused.status;

  // lamina generate prints a line per token after the completion.
  auto [code, out] =
      RunCli("generate --endpoint " + (*cluster)->endpoint() + " --prompt We --max-tokens 4 --logprobs 2");
  ASSERT_EQ(code, 0) << out;
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 5u) << out;
  for (size_t t = 1; t < lines.size(); ++t) {
    EXPECT_NE(lines[t].find("  top: \""), std::string::npos) << lines[t];
    EXPECT_EQ(std::vector<std::string>(absl::StrSplit(lines[t], " | ")).size(), 2u) << lines[t];
  }
}

// `weights: random` runs the model folder's shape with weights drawn from the seed: the cluster's
// greedy ids equal single-process mode's over ModelWeights::Random of that shape and seed, and
// differ from the checkpoint's.
TEST(ClusterTest, RandomWeightsOfTheModelsShapeMatchSingleProcessModeWithTheSameSeed) {
  ClusterOptions options;
  options.memory_nodes = 1;
  options.random_weights_seed = 11;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto checkpoint = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto random = LocalCluster::Create(ModelWeights::Random((*checkpoint)->config(), 11), ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(random.ok()) << random.status();

  const std::vector<std::vector<int32_t>> prompts = {{1021, 5, 77, 300}, {1021, 900}, {1021, 12, 13, 14, 15, 16}};
  std::vector<lamina::v1::GenerateRequest> requests;
  for (const std::vector<int32_t>& prompt : prompts) requests.push_back(IdsRequest(prompt, 12));
  const std::vector<Outcome> outcomes = GenerateConcurrently((*cluster)->client(), requests);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << "request " << i << ": " << outcomes[i].status;
    EXPECT_EQ(outcomes[i].ids, SingleProcessIds(**random, prompts[i], 12)) << "request " << i;
    EXPECT_NE(outcomes[i].ids, SingleProcessIds(**checkpoint, prompts[i], 12)) << "request " << i;
  }
}

// A memory node's `kv_dtype` sets its pool's element type, which it reports when it starts
// ("auto" is bfloat16 for the demo model's bfloat16 checkpoint): float32 takes twice the bytes for
// the same tokens, float8 a little over half (a float scale per token, layer and kv head). The
// greedy ids equal single-process mode's with that dtype. (The numbers themselves are checked in
// AttentionExecutorTest and DemoModelGoldenTest.)
TEST(ClusterTest, AMemoryNodesKvDtypeSetsItsPoolsElementType) {
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok()) << local.status();
  const std::vector<std::vector<int32_t>> prompts = {{1021, 5, 77, 300}, {1021, 900}};
  struct Case {
    std::string setting, reported;
  };
  for (const Case& c :
       {Case{"float32", "8192 KV slots in float32 (50.3 MB)"}, Case{"auto", "8192 KV slots in bfloat16 (25.2 MB)"},
        Case{"float8_e4m3", "8192 KV slots in float8_e4m3 (14.2 MB)"}}) {
    ClusterOptions options;
    options.memory_nodes = 1;
    options.kv_dtype = c.setting;
    auto cluster = ClusterHarness::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    EXPECT_NE((*cluster)->NodeLog("memory-0").find(c.reported), std::string::npos)
        << (*cluster)->NodeLog("memory-0") << "\nexpected: " << c.reported;
    ASSERT_TRUE((*local)->SetKvDtype(c.setting).ok());
    std::vector<lamina::v1::GenerateRequest> requests;
    for (const std::vector<int32_t>& prompt : prompts) requests.push_back(IdsRequest(prompt, 16));
    const std::vector<Outcome> outcomes = GenerateConcurrently((*cluster)->client(), requests);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(outcomes[i].status.ok()) << c.setting << ", request " << i << ": " << outcomes[i].status;
      EXPECT_EQ(outcomes[i].ids, SingleProcessIds(**local, prompts[i], 16)) << c.setting << ", request " << i;
    }
  }
}

TEST(ClusterTest, MalformedTopologiesAreRefusedBeforeAnyProcessStarts) {
  TempDir dir;
  const std::string good = absl::StrCat("model: ", ModelDir("lamina-demo-6m"), R"(
coordinator:
  port: )", FreePort(), R"(
nodes:
  - name: compute-0
    role: compute
    port: )", FreePort(), R"(
  - name: memory-0
    role: memory
    port: )", FreePort(), R"(
    data_port: )", FreePort(), R"(
    kv_capacity_tokens: 1024
)");
  struct Case {
    std::string from, to, expected;
  };
  const std::vector<Case> cases = {
      {"    kv_capacity_tokens: 1024", "    kv_capacity_tokens: 1024\n    flavour: vanilla",
       "topology.yaml:13: nodes[1].flavour: unknown field"},
      {"    kv_capacity_tokens: 1024", "    kv_capacity_tokens: lots",
       "topology.yaml:12: nodes[1].kv_capacity_tokens: expected an integer"},
      {"name: memory-0", "name: compute-0", "topology.yaml:8: nodes[1].name: duplicate node name 'compute-0'"},
      {"model: " + ModelDir("lamina-demo-6m"), "model: /nonexistent/model",
       "topology.yaml:1: model: '/nonexistent/model'"},
      {"    kv_capacity_tokens: 1024", "    kv_capacity_tokens: 1024\n    kv_dtype: fp8",
       "topology.yaml:13: nodes[1].kv_dtype: expected auto, float32, bfloat16 or float8_e4m3, got 'fp8'"},
      {"    kv_capacity_tokens: 1024", "    kv_capacity_tokens: 1024\n    kv_dtype: float32\n    device: cuda:0",
       "topology.yaml:13: nodes[1].kv_dtype: float32 is for the CPU; a GPU's KV pool is bfloat16 or float8_e4m3"},
      {"    role: compute", "    role: compute\n    kv_dtype: bfloat16",
       "topology.yaml:7: nodes[0].kv_dtype: a compute node's kv_dtype needs its kv_capacity_tokens"},
      {"    role: compute", "    role: compute\n    transport: tcp",
       "topology.yaml:7: nodes[0].transport: only memory nodes have this field"},
  };
  for (const Case& c : cases) {
    std::string yaml = good;
    yaml.replace(yaml.find(c.from), c.from.size(), c.to);
    const std::string path = dir.Write("topology.yaml", yaml);
    auto [code, out] = RunCli("up " + path + " --log-dir " + dir.path() + "/logs");
    EXPECT_EQ(code, 2) << out;
    EXPECT_NE(out.find(c.expected), std::string::npos) << out << "\nexpected: " << c.expected;
    EXPECT_EQ(out.find("starting"), std::string::npos) << "nothing may start: " << out;
  }
  // A port in use.
  auto holder = MakeTcpTransport()->Listen("127.0.0.1:0");
  ASSERT_TRUE(holder.ok());
  const std::string busy_port = (*holder)->address().substr((*holder)->address().rfind(':') + 1);
  std::string yaml = good;
  const size_t at = yaml.find("data_port: ") + 11;
  yaml.replace(at, yaml.find('\n', at) - at, busy_port);
  const std::string path = dir.Write("topology.yaml", yaml);
  auto [code, out] = RunCli("up " + path);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find(absl::StrCat("topology.yaml:8: nodes 'memory-0' data_port: port ", busy_port, " is already in use")),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace lamina::testing
