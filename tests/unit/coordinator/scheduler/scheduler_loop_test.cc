// The scheduler's loop against stand-in nodes: a compute node that answers every plan with one
// token per sequence, and a memory node that frees and forks, both real gRPC servers in this
// process (the scheduler reaches them as it reaches real ones). Every plan is recorded and checked:
// no step runs more sequences than `max_batch` or more tokens than the step's budget, requests are
// admitted in the order they came, and every one of them finishes.
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_config/model_config.h"
#include "common/tokenizer/model_tokenizer.h"
#include "common/topology/topology.h"
#include "coordinator/cluster/membership.h"
#include "coordinator/scheduler/prefill_budget.h"
#include "coordinator/scheduler/scheduler.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "lamina/v1/node.grpc.pb.h"

namespace lamina {
namespace {

constexpr int kMaxBatch = 4;
constexpr int kBudget = 48;  // tokens a step: decodes and prompt tokens

// Answers each plan with a token for every decode and every prompt's last chunk, and keeps the
// plans.
class StandInComputeNode final : public lamina::v1::ComputeNode::Service {
 public:
  grpc::Status Step(grpc::ServerContext* context,
                    grpc::ServerReaderWriter<lamina::v1::StepResult, lamina::v1::StepPlan>* stream) override {
    lamina::v1::StepPlan plan;
    while (stream->Read(&plan)) {
      lamina::v1::StepResult result;
      result.set_step_id(plan.step_id());
      for (const auto& item : plan.prefill()) {
        if (item.partial()) continue;
        auto* token = result.add_tokens();
        token->set_seq_id(item.seq_id());
        token->set_token(7);
      }
      for (const auto& item : plan.decode()) {
        auto* token = result.add_tokens();
        token->set_seq_id(item.seq_id());
        token->set_token(7);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        plans_.push_back(plan);
      }
      if (!stream->Write(result)) break;
    }
    return grpc::Status::OK;
  }

  std::vector<lamina::v1::StepPlan> plans() {
    std::lock_guard<std::mutex> lock(mu_);
    return plans_;
  }

 private:
  std::mutex mu_;
  std::vector<lamina::v1::StepPlan> plans_;
};

class StandInMemoryNode final : public lamina::v1::MemoryNode::Service {
 public:
  grpc::Status FreeSequences(grpc::ServerContext*, const lamina::v1::FreeSequencesRequest*,
                             lamina::v1::FreeSequencesResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status ForkSequence(grpc::ServerContext*, const lamina::v1::ForkSequenceRequest*,
                            lamina::v1::ForkSequenceResponse*) override {
    return grpc::Status::OK;
  }
};

// A gRPC server of `service` on a port of its own; `port` is set to it.
std::unique_ptr<grpc::Server> Serve(grpc::Service* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

TEST(SchedulerLoopTest, StepsStayWithinTheBatchAndTheBudgetAndRequestsAreAdmittedInOrder) {
  StandInComputeNode compute;
  StandInMemoryNode memory;
  int compute_port = 0, memory_port = 0;
  std::unique_ptr<grpc::Server> compute_server = Serve(&compute, &compute_port);
  std::unique_ptr<grpc::Server> memory_server = Serve(&memory, &memory_port);
  ASSERT_GT(compute_port, 0);
  ASSERT_GT(memory_port, 0);
  const std::string yaml = absl::StrCat(
      "model: ", LAMINA_SOURCE_DIR, "/deploy/models/lamina-demo-6m\n",
      "coordinator:\n  host: 127.0.0.1\n  port: 1\n",
      "scheduler:\n  max_batch: ", kMaxBatch, "\n  max_tokens_per_iteration: ", kBudget,
      "\n  prefix_caching: false\n  chunked_prefill: true\n",
      "nodes:\n",
      "  - name: compute-0\n    role: compute\n    host: 127.0.0.1\n    port: ", compute_port, "\n    device: cpu\n",
      "  - name: memory-0\n    role: memory\n    host: 127.0.0.1\n    port: ", memory_port,
      "\n    data_port: 2\n    device: cpu\n    kv_capacity_tokens: 4096\n");
  absl::StatusOr<Topology> topology = ParseTopology(yaml, "scheduler_loop_test.yaml");
  ASSERT_TRUE(topology.ok()) << topology.status();
  absl::StatusOr<ModelConfig> config = LoadModelConfig(topology->model_dir);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<Tokenizer> tokenizer = LoadModelTokenizer(topology->model_dir, *config);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();

  Membership membership(*topology, nullptr);
  for (const auto& [name, role] : {std::pair{"compute-0", lamina::v1::NODE_ROLE_COMPUTE},
                                   std::pair{"memory-0", lamina::v1::NODE_ROLE_MEMORY}}) {
    lamina::v1::RegisterRequest registration;
    registration.set_name(name);
    registration.set_role(role);
    registration.set_kv_capacity_slots(4096);
    ASSERT_TRUE(membership.Register(registration).ok());
  }
  std::atomic<bool> done{false};
  std::thread heartbeats([&] {  // the stand-ins stay alive
    while (!done) {
      for (const char* name : {"compute-0", "memory-0"}) {
        lamina::v1::HeartbeatRequest heartbeat;
        heartbeat.set_name(name);
        heartbeat.set_kv_free_slots(4096);
        membership.Heartbeat(heartbeat);
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  });

  {
    Scheduler scheduler(*topology, *config, &*tokenizer, &membership, nullptr, std::nullopt);
    // Twelve requests at once: prompts of 5 to 104 tokens (some beyond a step's budget), each
    // marked by its first token, and 3 to 6 tokens each.
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (int r = 0; r < 12; ++r) {
      GenerationSpec spec;
      spec.prompt.assign(5 + (r * 37) % 100, 11);
      spec.prompt[0] = 100 + r;
      spec.stop.max_tokens = 3 + r % 4;
      spec.stop.ignore_eos = true;
      absl::StatusOr<std::shared_ptr<RequestHandle>> handle = scheduler.Submit(std::move(spec));
      ASSERT_TRUE(handle.ok()) << handle.status();
      handles.push_back(*handle);
    }
    for (int r = 0; r < 12; ++r) {
      int generated = 0;
      RequestEvent event;
      bool ended = false;
      while (!ended && handles[r]->Pop(&event, absl::Seconds(30))) {
        EXPECT_TRUE(event.error.ok()) << "request " << r << ": " << event.error;
        generated += static_cast<int>(event.token_ids.size());
        ended = event.done;
      }
      EXPECT_TRUE(ended) << "request " << r << " never ended";
      EXPECT_EQ(generated, 3 + r % 4) << "request " << r;
    }
  }
  done = true;
  heartbeats.join();

  const std::vector<lamina::v1::StepPlan> plans = compute.plans();
  ASSERT_FALSE(plans.empty());
  std::vector<int> admitted;  // requests by their prompts' first token, in the order they started
  for (const lamina::v1::StepPlan& plan : plans) {
    EXPECT_LE(plan.prefill_size() + plan.decode_size(), kMaxBatch) << "step " << plan.step_id();
    int64_t tokens = plan.decode_size();
    for (const auto& item : plan.prefill()) {
      tokens += item.tokens_size();
      if (item.start_position() == 0 && !item.resume()) admitted.push_back(item.tokens(0) - 100);
    }
    // The budget, but for the least a step prefills of its first prompt so that prompts move.
    EXPECT_LE(tokens, std::max<int64_t>(kBudget, plan.decode_size() + kMinPrefillChunk)) << "step " << plan.step_id();
  }
  std::vector<int> in_order(12);
  for (int r = 0; r < 12; ++r) in_order[r] = r;
  EXPECT_EQ(admitted, in_order);
}

}  // namespace
}  // namespace lamina
