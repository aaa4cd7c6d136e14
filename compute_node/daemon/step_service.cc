#include "compute_node/daemon/step_service.h"

#include <chrono>
#include <vector>

namespace lamina {
namespace {

SamplingParams FromProto(const lamina::v1::SamplingParams& p) {
  SamplingParams params;
  params.temperature = p.temperature();
  params.top_k = p.top_k();
  params.top_p = p.top_p() > 0 ? p.top_p() : 1.0f;
  params.seed = p.seed();
  return params;
}

}  // namespace

StepService::StepService(std::vector<StepLane> lanes) : lanes_(lanes.size()) {
  for (size_t i = 0; i < lanes.size(); ++i) {
    lanes_[i].parts = lanes[i];
    lanes[i].attention->set_compute_meter(&computing_);
  }
}

BusyMeter::Snapshot StepService::RoundTrips() const {
  BusyMeter::Snapshot total;
  for (const Lane& lane : lanes_) {
    const BusyMeter::Snapshot trips = lane.parts.attention->round_trips().Read();
    total.busy_seconds += trips.busy_seconds;
    total.count += trips.count;
    total.clock_seconds = trips.clock_seconds;
  }
  return total;
}

std::optional<int> StepService::HoldLane(grpc::ServerContext* context) {
  std::unique_lock<std::mutex> lock(lanes_mu_);
  for (;;) {
    for (size_t i = 0; i < lanes_.size(); ++i) {
      if (!lanes_[i].held) {
        lanes_[i].held = true;
        return static_cast<int>(i);
      }
    }
    lane_freed_.wait_for(lock, std::chrono::milliseconds(100));
    if (context->IsCancelled()) return std::nullopt;
  }
}

void StepService::ReleaseLane(int lane) {
  {
    std::lock_guard<std::mutex> lock(lanes_mu_);
    lanes_[lane].held = false;
  }
  lane_freed_.notify_one();
}

lamina::v1::StepResult StepService::RunPlan(const lamina::v1::StepPlan& plan, int lane_index) {
  Lane& lane = lanes_[lane_index];
  ComputeEngine* engine = lane.parts.engine;
  RemoteAttention* attention = lane.parts.attention;
  ScopedBusy timed(&busy_);
  ScopedActive active(&computing_);
  lamina::v1::StepResult result;
  result.set_step_id(plan.step_id());
  auto fail = [&](const absl::Status& status) {
    result.clear_tokens();
    result.set_error_code(static_cast<int32_t>(status.code()));
    result.set_error_message(std::string(status.message()));
    for (const std::string& node : attention->TakeFailedNodes()) result.add_failed_memory_nodes(node);
    return result;
  };

  {
    std::lock_guard<std::mutex> lock(samplers_mu_);
    for (int64_t seq : plan.release()) samplers_.erase(seq);
  }
  for (int64_t seq : plan.release()) attention->Forget(seq);
  // Whole prompts run as a prefill batch. A prompt continuing a cached prefix runs on the decode
  // path instead (its tokens attend over the prefix held by the memory node), after the running
  // sequences' tokens. `logits_of[i]` is where prefill item i's next-token logits come from.
  struct LogitsRow {
    const Tensor* logits;
    int64_t row;
  };
  std::vector<LogitsRow> logits_of(plan.prefill_size());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<PrefillSequence> prefill;
  prompts.reserve(plan.prefill_size());
  std::vector<DecodeToken> decode;
  for (const auto& item : plan.decode()) {
    absl::Status assigned = attention->Assign(item.seq_id(), item.memory_node());
    if (!assigned.ok()) return fail(assigned);
    decode.push_back({item.seq_id(), item.token(), item.position()});
  }
  for (int i = 0; i < plan.prefill_size(); ++i) {
    const auto& item = plan.prefill(i);
    absl::Status assigned = attention->Assign(item.seq_id(), item.memory_node());
    if (!assigned.ok()) return fail(assigned);
    if (item.start_position() > 0) {
      for (int t = 0; t < item.tokens_size(); ++t) {
        decode.push_back({item.seq_id(), item.tokens(t), item.start_position() + t});
      }
      logits_of[i] = {&lane.decode_logits, static_cast<int64_t>(decode.size()) - 1};
      continue;
    }
    prompts.emplace_back(item.tokens().begin(), item.tokens().end());
    prefill.push_back({item.seq_id(), prompts.back()});
    logits_of[i] = {&lane.prefill_logits, static_cast<int64_t>(prefill.size()) - 1};
  }

  if (!prefill.empty()) {
    absl::Status status = engine->Prefill(prefill, /*all_positions=*/false, &lane.prefill_logits);
    if (!status.ok()) return fail(status);
  }
  if (!decode.empty()) {
    absl::Status status = engine->Decode(decode, &lane.decode_logits);
    if (!status.ok()) return fail(status);
  }

  // Sampling happens only once the whole step succeeded, so a retried step draws the same tokens.
  std::lock_guard<std::mutex> lock(samplers_mu_);
  const int64_t vocab = engine->config().vocab_size;
  for (int i = 0; i < plan.prefill_size(); ++i) {
    const auto& item = plan.prefill(i);
    const SamplingParams params = FromProto(item.sampling());
    std::vector<int64_t> samples = {item.seq_id()};
    samples.insert(samples.end(), item.fork_seq_ids().begin(), item.fork_seq_ids().end());
    for (size_t k = 0; k < samples.size(); ++k) {
      SamplingParams own = params;
      own.seed = params.seed + k;
      auto it = samplers_.find(samples[k]);
      if (!item.resume() || it == samplers_.end()) {
        it = samplers_.insert_or_assign(samples[k], Sampler(own)).first;  // a resumed one keeps its stream
      }
      auto* token = result.add_tokens();
      token->set_seq_id(samples[k]);
      token->set_token(it->second.Sample(logits_of[i].logits->row(logits_of[i].row), vocab));
    }
  }
  for (int i = 0; i < plan.decode_size(); ++i) {
    const auto& item = plan.decode(i);
    auto it = samplers_.find(item.seq_id());
    if (it == samplers_.end()) it = samplers_.emplace(item.seq_id(), Sampler(SamplingParams{})).first;
    auto* token = result.add_tokens();
    token->set_seq_id(item.seq_id());
    token->set_token(it->second.Sample(lane.decode_logits.row(i), vocab));
  }
  return result;
}

void StepService::Abandon(const lamina::v1::StepPlan& plan, int lane) {
  RemoteAttention* attention = lanes_[lane].parts.attention;
  std::lock_guard<std::mutex> lock(samplers_mu_);
  auto forget = [&](int64_t seq) {
    attention->Free(seq);
    samplers_.erase(seq);
  };
  for (const auto& item : plan.prefill()) {
    forget(item.seq_id());
    for (int64_t fork : item.fork_seq_ids()) forget(fork);
  }
  for (const auto& item : plan.decode()) forget(item.seq_id());
}

grpc::Status StepService::Step(grpc::ServerContext* context,
                               grpc::ServerReaderWriter<lamina::v1::StepResult, lamina::v1::StepPlan>* stream) {
  const std::optional<int> lane = HoldLane(context);
  if (!lane) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled while waiting for a free lane");
  lamina::v1::StepPlan plan;
  while (!context->IsCancelled() && stream->Read(&plan)) {
    lamina::v1::StepResult result = RunPlan(plan, *lane);
    if (context->IsCancelled() || !stream->Write(result)) {
      // The coordinator gave up on this step (the node was declared dead, or the step timed out)
      // and has ended these sequences: undo what the late step put on the memory nodes.
      Abandon(plan, *lane);
      break;
    }
  }
  ReleaseLane(*lane);
  return grpc::Status::OK;
}

}  // namespace lamina
