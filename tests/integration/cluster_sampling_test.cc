// Sampling parameters on a real cluster, against single-process mode. Penalties: the compute node
// counts the tokens of each sequence, including those it never computed (a cached prompt prefix, a
// prompt's earlier chunks, a preempted sample's output before it was recomputed), so every output
// equals single-process mode's. min_p reaches the sampler.
#include <map>
#include <string>
#include <vector>

#include "compute_node/sampling/sampling_proto.h"
#include "coordinator/embedded/local_cluster.h"
#include "gtest/gtest.h"
#include "lamina/v1/generation.pb.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/requests_in_flight.h"
#include "tests/support/golden.h"

namespace lamina::testing {
namespace {

// Penalties strong enough to change the demo model's greedy text.
lamina::v1::GenerateRequest Penalized(const std::vector<int32_t>& prompt, int max_tokens, float temperature = 0.0f,
                                      uint64_t seed = 0) {
  lamina::v1::GenerateRequest r = IdsRequest(prompt, max_tokens);
  r.mutable_sampling()->set_repetition_penalty(2.0f);
  r.mutable_sampling()->set_presence_penalty(1.5f);
  r.mutable_sampling()->set_frequency_penalty(1.0f);
  r.mutable_sampling()->set_temperature(temperature);
  r.mutable_sampling()->set_seed(seed);
  return r;
}

// Sample k's tokens in single-process mode, for each k of the request's n.
std::map<int32_t, std::vector<int32_t>> SingleProcess(LocalCluster& local, const lamina::v1::GenerateRequest& r) {
  GenerationRequest single;
  single.prompt.assign(r.token_ids().ids().begin(), r.token_ids().ids().end());
  single.max_tokens = r.max_tokens();
  single.ignore_eos = r.ignore_eos();
  single.n = r.n() > 0 ? r.n() : 1;
  single.sampling = SamplingFromProto(r.sampling());
  std::map<int32_t, std::vector<int32_t>> ids;
  const absl::Status status =
      local.Generate({&single, 1}, [&](const TokenEvent& e) { ids[e.sample].push_back(e.token); });
  EXPECT_TRUE(status.ok()) << status;
  return ids;
}

std::map<int32_t, std::vector<int32_t>> OnCluster(ClusterHarness& cluster, const lamina::v1::GenerateRequest& r) {
  std::map<int32_t, std::vector<int32_t>> ids;
  const absl::Status status = cluster.client().Generate(r, [&](const lamina::v1::GenerateResponse& response) {
    ids[response.index()].insert(ids[response.index()].end(), response.token_ids().begin(), response.token_ids().end());
  });
  EXPECT_TRUE(status.ok()) << status;
  return ids;
}

// A float32 KV cache on both sides. With a bfloat16 one, a token computed over the stored KV
// (continuing a cached prefix or an earlier chunk, or decoded before a preemption) gets logits
// about 1e-2 off those of the same token computed in a whole prefill; penalties flatten the
// distribution enough that such a shift can move a sampled draw to a neighbouring token id.
void UseFloat32Kv(LocalCluster& local, ClusterOptions* options) {
  ASSERT_TRUE(local.SetKvDtype("float32").ok());
  options->kv_dtype = "float32";
}

TEST(ClusterTest, PenaltiesCountCachedPrefixesAndEarlierChunksAndEqualSingleProcessMode) {
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok()) << local.status();
  std::string text;
  while (text.size() < 700) {
    text += "Attention offloading moves the KV cache to cheap memory devices, which run attention. ";
  }
  const std::vector<int32_t> long_a = (*local)->tokenizer().EncodePrompt(text + "Question one: why?");
  const std::vector<int32_t> long_b = (*local)->tokenizer().EncodePrompt(text + "Question two: how?");
  ASSERT_GT(long_a.size(), 100u);
  ClusterOptions options;
  options.memory_nodes = 1;
  options.max_tokens_per_iteration = 48;  // the long prompts come in chunks
  UseFloat32Kv(**local, &options);
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  // long_a fills the prefix cache; long_b then continues its cached blocks. A sampled request
  // with two samples, each counting its own tokens.
  lamina::v1::GenerateRequest sampled = Penalized(long_b, 30, 1.0f, 17);
  sampled.set_n(2);
  const std::vector<lamina::v1::GenerateRequest> requests = {Penalized(long_a, 30), Penalized(long_b, 30), sampled};
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto want = SingleProcess(**local, requests[i]);
    EXPECT_EQ(OnCluster(**cluster, requests[i]), want) << "request " << i;
    lamina::v1::GenerateRequest plain = requests[i];
    plain.mutable_sampling()->clear_repetition_penalty();
    plain.mutable_sampling()->clear_presence_penalty();
    plain.mutable_sampling()->clear_frequency_penalty();
    EXPECT_NE(SingleProcess(**local, plain), want) << "request " << i << ": the penalties changed nothing";
  }

  lamina::v1::GenerateRequest min_p = IdsRequest(long_a, 30);
  min_p.mutable_sampling()->set_temperature(1.5f);
  min_p.mutable_sampling()->set_seed(3);
  min_p.mutable_sampling()->set_min_p(0.05f);
  EXPECT_EQ(OnCluster(**cluster, min_p), SingleProcess(**local, min_p)) << "min_p";

  lamina::v1::GenerateRequest bad = Penalized(long_a, 4);
  bad.mutable_sampling()->set_repetition_penalty(-1.0f);
  const Outcome refused = Generate((*cluster)->client(), bad);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status.message().find("repetition_penalty must be > 0, got -1"), std::string::npos)
      << refused.status;
}

// A preempted sample is recomputed from its prompt and output (in chunks here): its penalties
// count that output as generated, so it draws what it would have drawn.
TEST(ClusterTest, PreemptedPenalizedRequestsCompleteWithIdenticalOutputs) {
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok()) << local.status();
  const std::vector<std::string> texts = {"The memory devices", "FlashAttention", "We", "GPU memory"};
  std::vector<lamina::v1::GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    const std::vector<int32_t> prompt = (*local)->tokenizer().EncodePrompt(texts[i % texts.size()]);
    requests.push_back(i < 4 ? Penalized(prompt, 150) : Penalized(prompt, 150, 1.0f, 100 + i));
  }
  ClusterOptions options;
  UseFloat32Kv(**local, &options);
  options.memory_nodes = 1;
  options.kv_capacity_tokens = 240;  // each fits alone; together they run the pool dry
  options.max_tokens_per_iteration = 32;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<Outcome> outcomes = GenerateConcurrently((*cluster)->client(), requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << "request " << i << ": " << outcomes[i].status;
    EXPECT_EQ(outcomes[i].ids, SingleProcess(**local, requests[i]).at(0)) << "request " << i;
  }
  auto status = (*cluster)->client().Status(absl::Seconds(1));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_GT(status->preemptions(), 0) << "the pool never ran dry: the test does not test preemption";
}

}  // namespace
}  // namespace lamina::testing
