// The scheduler's checks of a request, before it queues: every malformed field is refused with its
// name, the cluster's state (no live node; no pool large enough) comes after, and nothing refused
// is queued. No node runs here: membership is told of nodes directly, and nothing is admitted.
#include "coordinator/scheduler/scheduler.h"

#include <memory>
#include <string>
#include <vector>

#include "common/model_config/model_config.h"
#include "common/tokenizer/model_tokenizer.h"
#include "common/topology/topology.h"
#include "coordinator/cluster/membership.h"
#include "gtest/gtest.h"

namespace lamina {
namespace {

class SchedulerChecksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Topology> topology =
        LoadTopology(std::string(LAMINA_SOURCE_DIR) + "/deploy/topologies/local-cpu.yaml");
    ASSERT_TRUE(topology.ok()) << topology.status();
    topology_ = *topology;
    absl::StatusOr<ModelConfig> config = LoadModelConfig(topology_.model_dir);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    absl::StatusOr<Tokenizer> tokenizer = LoadModelTokenizer(topology_.model_dir, config_);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::make_unique<Tokenizer>(std::move(*tokenizer));
    membership_ = std::make_unique<Membership>(topology_, nullptr);
    scheduler_ = std::make_unique<Scheduler>(topology_, config_, tokenizer_.get(), membership_.get(), nullptr,
                                             std::nullopt);
  }

  // A one-token greedy request of `max_tokens`.
  static GenerationSpec Spec(std::vector<int32_t> prompt = {1, 2, 3}, int32_t max_tokens = 4) {
    GenerationSpec spec;
    spec.prompt = std::move(prompt);
    spec.stop.max_tokens = max_tokens;
    return spec;
  }

  // The refusal of `spec`, as "CODE: message".
  std::string Refusal(GenerationSpec spec) {
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle = scheduler_->Submit(std::move(spec));
    return handle.ok() ? "queued" : handle.status().ToString();
  }

  Topology topology_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(SchedulerChecksTest, EveryMalformedFieldIsRefusedByName) {
  const int32_t vocab = static_cast<int32_t>(config_.vocab_size);
  const int32_t context = static_cast<int32_t>(config_.max_position_embeddings);
  EXPECT_EQ(Refusal(Spec({})), "INVALID_ARGUMENT: the prompt is empty");
  EXPECT_EQ(Refusal(Spec(std::vector<int32_t>(context, 1))),
            "INVALID_ARGUMENT: the prompt has " + std::to_string(context) + " tokens; the model's context is " +
                std::to_string(context) + " tokens");
  EXPECT_EQ(Refusal(Spec({1, vocab, 2})), "INVALID_ARGUMENT: token id " + std::to_string(vocab) +
                                              " is outside the vocabulary (0.." + std::to_string(vocab - 1) + ")");
  EXPECT_EQ(Refusal(Spec({-1})), "INVALID_ARGUMENT: token id -1 is outside the vocabulary (0.." +
                                     std::to_string(vocab - 1) + ")");
  EXPECT_EQ(Refusal(Spec({1}, 0)), "INVALID_ARGUMENT: max_tokens must be at least 1");
  for (int32_t n : {0, 65}) {
    GenerationSpec spec = Spec();
    spec.n = n;
    EXPECT_EQ(Refusal(spec), "INVALID_ARGUMENT: n must be from 1 to 64, got " + std::to_string(n));
  }
  GenerationSpec hot = Spec();
  hot.sampling.top_p = 0;
  EXPECT_EQ(Refusal(hot), "INVALID_ARGUMENT: top_p must be in (0, 1], got 0");
  // Well formed, but nothing is up: the cluster's state, naming what is missing.
  const std::string down = Refusal(Spec());
  EXPECT_EQ(down.rfind("UNAVAILABLE: the cluster cannot serve: compute-0 (host 127.0.0.1) not registered", 0), 0u)
      << down;
  EXPECT_EQ(scheduler_->Stats().queued, 0);
}

TEST_F(SchedulerChecksTest, ARequestNoLivePoolCouldHoldIsRefusedWithTheSlotsItNeeds) {
  for (const char* name : {"compute-0", "memory-0"}) {
    lamina::v1::RegisterRequest registration;
    registration.set_name(name);
    registration.set_role(std::string(name) == "compute-0" ? lamina::v1::NODE_ROLE_COMPUTE
                                                           : lamina::v1::NODE_ROLE_MEMORY);
    registration.set_kv_capacity_slots(100);
    ASSERT_TRUE(membership_->Register(registration).ok());
  }
  GenerationSpec spec = Spec({1, 2, 3}, 50);
  spec.n = 2;  // 3 + 2 x 50 = 103 slots, and no pool has more than 100
  EXPECT_EQ(Refusal(spec),
            "RESOURCE_EXHAUSTED: the request needs 103 KV slots (prompt 3 + 2 x max_tokens 50); the largest KV pool "
            "has 100");
  EXPECT_EQ(scheduler_->Stats().queued, 0);
}

}  // namespace
}  // namespace lamina
