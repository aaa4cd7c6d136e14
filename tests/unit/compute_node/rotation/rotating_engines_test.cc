// ComputeEngine under rotational pipelining and under a layer split: R engines, one per replica,
// each running only the slices its replica owns and handing the batch on through SliceRelays
// (in-process transport), give the golden logits (float64 reference) and exactly the logits one
// engine gives alone, for prefill and teacher-forced decode, whichever replica the batch starts
// on (rotation) and however the layers are split.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compute_node/engine/compute_engine.h"
#include "compute_node/rotation/slice_relay.h"
#include "gtest/gtest.h"
#include "kv/attention/attention_executor.h"
#include "tests/support/golden.h"

namespace lamina {
namespace {

using ::lamina::testing::GoldenTensors;
using ::lamina::testing::ModelDir;
using ::lamina::testing::RelativeError;

constexpr double kLogitTolerance = 1e-4;  // float32 CPU arithmetic (fixtures README)

std::string Key(int prompt, const std::string& what) { return "prompt_" + std::to_string(prompt) + "." + what; }

// R replicas of one model sharing one memory side, all routing batch `batch`.
struct Replicas {
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<AttentionExecutor> memory;
  std::unique_ptr<Transport> transport = MakeInprocTransport();
  std::vector<std::unique_ptr<ResidualInbox>> inboxes;
  std::vector<std::unique_ptr<SliceRelay>> relays;
  std::vector<std::unique_ptr<ComputeEngine>> engines;
  std::unique_ptr<ComputeEngine> alone;  // every slice on one engine, for comparison
  uint64_t step = 0;

  // `first_layers`: a layer split's replicas' first layers (empty: rotation).
  Replicas(const std::string& model, int replicas, int batch, const std::vector<int64_t>& first_layers) {
    weights = std::move(*ModelWeights::Load(ModelDir(model)));
    const ModelConfig& c = weights->config;
    memory = std::move(*AttentionExecutor::Create(
        {c.num_layers, 4096, {c.num_q_heads, c.num_kv_heads, c.head_dim, c.sliding_window}}));
    const std::string name = absl::StrCat("rotating-", model, "-", replicas, "-", batch);
    for (int r = 0; r < replicas; ++r) {
      inboxes.push_back(*ResidualInbox::Start(transport.get(), absl::StrCat(name, "-", r)));
    }
    for (int r = 0; r < replicas; ++r) {
      const int next = (r + 1) % replicas, previous = (r + replicas - 1) % replicas;
      relays.push_back(std::make_unique<SliceRelay>(
          transport.get(), inboxes[r].get(), SliceRoute{batch, r, replicas, first_layers},
          RelayPeers{absl::StrCat("compute-", r), absl::StrCat("compute-", next), absl::StrCat(name, "-", next),
                     absl::StrCat("compute-", previous)},
          absl::Seconds(20)));
      engines.push_back(std::make_unique<ComputeEngine>(weights.get(), memory.get()));
      engines.back()->set_handoff(relays.back().get());
    }
    alone = std::make_unique<ComputeEngine>(weights.get(), memory.get());
  }

  // Runs `pass` on every replica at once; the logits come from the one running the last slice.
  template <typename Pass>
  void RunAll(Pass pass, Tensor* logits) {
    ++step;
    std::vector<absl::Status> statuses(engines.size());
    std::vector<Tensor> outputs(engines.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < engines.size(); ++r) {
      relays[r]->BeginStep(step);
      threads.emplace_back([&, r] { statuses[r] = pass(*engines[r], &outputs[r]); });
    }
    for (std::thread& t : threads) t.join();
    int last = -1;
    for (size_t r = 0; r < engines.size(); ++r) {
      ASSERT_TRUE(statuses[r].ok()) << "replica " << r << ": " << statuses[r];
      if (engines[r]->RunsLastSlice()) {
        EXPECT_EQ(last, -1) << "two replicas ran the last slice";
        last = static_cast<int>(r);
      } else {
        EXPECT_EQ(outputs[r].size(), 0) << "replica " << r << " wrote logits without running the last slice";
      }
    }
    ASSERT_GE(last, 0) << "no replica ran the last slice";
    *logits = std::move(outputs[last]);
  }
};

struct RotationCase {
  std::string model;
  int replicas;
  int batch;
  std::vector<int64_t> first_layers;  // a layer split (empty: rotation)
};

class RotatingEnginesTest : public ::testing::TestWithParam<RotationCase> {};

TEST_P(RotatingEnginesTest, GivesTheGoldenLogitsAndExactlyWhatOneEngineGives) {
  const RotationCase& param = GetParam();
  Replicas replicas(param.model, param.replicas, param.batch, param.first_layers);
  GoldenTensors golden(param.model);
  // Two prompts in one batch, so that rows stay apart through the hand-overs.
  std::vector<std::vector<int32_t>> ids = {golden.Ids(Key(0, "ids")), golden.Ids(Key(1, "ids"))};
  std::vector<std::vector<int32_t>> greedy = {golden.Ids(Key(0, "greedy_ids")), golden.Ids(Key(1, "greedy_ids"))};
  std::vector<Tensor> expected;
  for (int p = 0; p < 2; ++p) expected.push_back(golden.Float(Key(p, "greedy_logits")));

  std::vector<PrefillSequence> rotated = {{0, ids[0]}, {1, ids[1]}};
  std::vector<PrefillSequence> single = {{10, ids[0]}, {11, ids[1]}};
  Tensor logits, alone_logits;
  replicas.RunAll([&](ComputeEngine& e, Tensor* out) { return e.Prefill(rotated, false, out); }, &logits);
  ASSERT_TRUE(replicas.alone->Prefill(single, false, &alone_logits).ok());
  ASSERT_EQ(logits.shape(), alone_logits.shape());
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(std::vector<float>(logits.row(p), logits.row(p) + logits.dim(1)),
              std::vector<float>(alone_logits.row(p), alone_logits.row(p) + logits.dim(1)))
        << "prompt " << p << " after prefill";
  }

  // Teacher-forced decode; the golden row s comes after feeding greedy[s] (tiny models).
  const int64_t steps = std::min<int64_t>(4, std::min(expected[0].dim(0), expected[1].dim(0)));
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<DecodeToken> batch, batch_alone;
    for (int p = 0; p < 2; ++p) {
      const int32_t position = static_cast<int32_t>(ids[p].size() + s);
      batch.push_back({p, greedy[p][s], position});
      batch_alone.push_back({10 + p, greedy[p][s], position});
    }
    replicas.RunAll([&](ComputeEngine& e, Tensor* out) { return e.Decode(batch, out); }, &logits);
    ASSERT_TRUE(replicas.alone->Decode(batch_alone, &alone_logits).ok());
    for (int p = 0; p < 2; ++p) {
      EXPECT_LT(RelativeError(logits.row(p), expected[p].row(s), expected[p].dim(1)), kLogitTolerance)
          << "prompt " << p << " step " << s;
      EXPECT_EQ(std::vector<float>(logits.row(p), logits.row(p) + logits.dim(1)),
                std::vector<float>(alone_logits.row(p), alone_logits.row(p) + logits.dim(1)))
          << "prompt " << p << " step " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Routes, RotatingEnginesTest,
    ::testing::Values(RotationCase{"tiny-llama2", 2, 0, {}}, RotationCase{"tiny-llama2", 2, 1, {}},
                      RotationCase{"tiny-llama3", 3, 2, {}},
                      // Layer splits: tiny-llama2 has 3 layers, tiny-llama3 4.
                      RotationCase{"tiny-llama2", 2, 0, {0, 2}}, RotationCase{"tiny-llama3", 2, 1, {0, 1}},
                      RotationCase{"tiny-llama3", 3, 2, {0, 1, 3}}),
    [](const ::testing::TestParamInfo<RotationCase>& info) {
      std::string model = info.param.model;
      std::replace(model.begin(), model.end(), '-', '_');
      std::string split = info.param.first_layers.empty() ? "" : "_split_at";
      for (int64_t first : info.param.first_layers) absl::StrAppend(&split, "_", first);
      return absl::StrCat(model, "_", info.param.replicas, "_replicas_batch_", info.param.batch, split);
    });

}  // namespace
}  // namespace lamina
