#include "compute_node/daemon/step_service.h"

#include <chrono>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/call_auth.h"
#include "common/threading/quiescent_release.h"
#include "compute_node/sampling/sampling_proto.h"

namespace lamina {
namespace {

void ToProto(const TokenLogprobs& logprobs, lamina::v1::TokenLogprobs* out) {
  out->set_logprob(logprobs.logprob);
  for (int32_t k = 0; k < logprobs.top_count; ++k) {
    auto* top = out->add_top();
    top->set_token_id(logprobs.top_ids[k]);
    top->set_logprob(logprobs.top_logprobs[k]);
  }
}

// The tokens a prompt's penalties count (none without penalties): the context the coordinator sent
// for positions before start_position, then the item's own tokens.
absl::StatusOr<std::optional<TokenHistory>> PromptHistory(const lamina::v1::PrefillItem& item,
                                                          const SamplingParams& params) {
  if (!params.has_penalties()) return std::nullopt;
  if (item.context_tokens_size() != item.start_position()) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", item.seq_id(), " has penalties and starts at position ",
                                                   item.start_position(), " but its prefill item carries ",
                                                   item.context_tokens_size(), " context tokens"));
  }
  TokenHistory history(item.prompt_length());
  int32_t position = 0;
  for (int32_t token : item.context_tokens()) history.Add(position++, token);
  for (int32_t token : item.tokens()) history.Add(position++, token);
  return history;
}

}  // namespace

StepService::StepService(std::vector<BatchRunner> runners, std::vector<SliceRelay*> relays, bool device_busy,
                         std::optional<ClusterSecret> secret)
    : runners_(runners.size()), relays_(std::move(relays)), secret_(std::move(secret)) {
  for (size_t i = 0; i < runners.size(); ++i) {
    runners_[i].parts = runners[i];
    runners[i].attention->set_compute_meter(&computing_);
    if (device_busy) runners[i].engine->set_device_busy(&device_computing_);
  }
  for (SliceRelay* relay : relays_) relay->set_compute_meter(&computing_);
}

void StepService::ForgetSequences() {
  std::lock_guard<std::mutex> lock(sampling_mu_);
  sampling_.clear();
}

double StepService::ComputingSeconds() const {
  const BusyMeter::Snapshot device = device_computing_.Read();
  return device.count > 0 ? device.busy_seconds : computing_.Read().busy_seconds;
}

BusyMeter::Snapshot StepService::RoundTrips() const {
  BusyMeter::Snapshot total;
  for (const Runner& runner : runners_) {
    const BusyMeter::Snapshot trips = runner.parts.attention->round_trips().Read();
    total.busy_seconds += trips.busy_seconds;
    total.count += trips.count;
    total.clock_seconds = trips.clock_seconds;
  }
  return total;
}

std::optional<int> StepService::HoldRunner(grpc::ServerContext* context) {
  std::unique_lock<std::mutex> lock(runners_mu_);
  for (;;) {
    for (size_t i = 0; i < runners_.size(); ++i) {
      if (!runners_[i].held) {
        runners_[i].held = true;
        return static_cast<int>(i);
      }
    }
    runner_freed_.wait_for(lock, std::chrono::milliseconds(100));
    if (context->IsCancelled()) return std::nullopt;
  }
}

void StepService::ReleaseRunner(int runner) {
  {
    std::lock_guard<std::mutex> lock(runners_mu_);
    runners_[runner].held = false;
  }
  runner_freed_.notify_one();
}

absl::StatusOr<SliceRelay*> StepService::RelayFor(const lamina::v1::StepPlan& plan) const {
  if (plan.rotation_replicas() == 0) return nullptr;
  const int batch = plan.rotation_batch();
  if (batch < 0 || batch >= static_cast<int>(relays_.size()) ||
      relays_[batch]->route().replicas != plan.rotation_replicas()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the plan rotates batch ", batch, " over ", plan.rotation_replicas(), " compute nodes; this node was started for ",
        relays_.empty() ? 0 : relays_[0]->route().replicas, " (", relays_.size(), " batches): do the coordinator "
        "and this node read the same topology?"));
  }
  return relays_[batch];
}

lamina::v1::StepResult StepService::RunPlan(const lamina::v1::StepPlan& plan, int runner_index) {
  Runner& runner = runners_[runner_index];
  ComputeEngine* engine = runner.parts.engine;
  PlacedAttention* attention = runner.parts.attention;
  ScopedBusy timed(&busy_);
  ScopedActive active(&computing_);
  // Its device work may spin on other nodes: no link's memory is freed meanwhile.
  ScopedDeviceStep device_step;
  lamina::v1::StepResult result;
  result.set_step_id(plan.step_id());
  SliceRelay* rotating = nullptr;  // this step's relay to the next compute node, once begun
  RankGroup* group = runner.parts.rank_group;
  if (group != nullptr) group->BeginStep(plan.step_id());
  auto fail = [&](const absl::Status& status) {
    if (rotating != nullptr) rotating->AbandonStep();
    if (group != nullptr) group->AbandonStep();  // the other ranks' waits on this step end now
    // The coordinator ends the step's sequences; the node's log says why, for whoever reads it.
    std::fprintf(stderr, "step %llu (batch runner %d) failed: %s\n", static_cast<unsigned long long>(plan.step_id()),
                 runner_index, status.ToString().c_str());
    result.clear_tokens();
    result.set_error_code(static_cast<int32_t>(status.code()));
    result.set_error_message(std::string(status.message()));
    for (RemoteAttention::FailedNode& node : attention->TakeFailedNodes()) {
      lamina::v1::FailedMemoryNode* failed = result.add_failed_memory_nodes();
      failed->set_name(std::move(node.name));
      failed->set_reason(std::move(node.reason));
    }
    return result;
  };

  {
    std::lock_guard<std::mutex> lock(sampling_mu_);
    for (int64_t seq : plan.release()) sampling_.erase(seq);
  }
  for (int64_t seq : plan.release()) attention->Forget(seq);

  // Whole prompts, and the first chunks of prompts prefilled in chunks, run as a prefill batch. A
  // prompt continuing a cached prefix or an earlier chunk runs on the decode path instead (its
  // tokens attend over what the memory node holds), after the running sequences' tokens. Every
  // sequence but a partial item's draws one token; the result lists them in plan order: each
  // prefill item's sequence and forks, then the decode items.
  std::vector<std::vector<int32_t>> prompts;
  prompts.reserve(plan.prefill_size());
  std::vector<PrefillSequence> prefill;
  std::vector<DecodeToken> decode;
  std::vector<TokenDraw> prefill_draws, decode_draws;
  struct Slot {
    int64_t seq;
    bool from_prefill;
    size_t draw;
  };
  std::vector<Slot> order;
  std::vector<std::pair<int64_t, SequenceSampling>> new_sampling;  // registered once the step succeeds
  for (const auto& item : plan.decode()) {
    absl::Status assigned = attention->Assign(item.seq_id(), item.memory_node());
    if (!assigned.ok()) return fail(assigned);
    decode.push_back({item.seq_id(), item.token(), item.position()});
  }
  for (int i = 0; i < plan.prefill_size(); ++i) {
    const auto& item = plan.prefill(i);
    absl::Status assigned = attention->Assign(item.seq_id(), item.memory_node());
    if (!assigned.ok()) return fail(assigned);
    const bool continues = item.start_position() > 0;
    if (item.partial() && item.fork_seq_ids_size() > 0) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "sequence ", item.seq_id(), ": a partial prefill item carries forks (they come with its last chunk)")));
    }
    int64_t row;
    if (continues) {
      for (int t = 0; t < item.tokens_size(); ++t) {
        decode.push_back({item.seq_id(), item.tokens(t), item.start_position() + t});
      }
      row = static_cast<int64_t>(decode.size()) - 1;
    } else {
      prompts.emplace_back(item.tokens().begin(), item.tokens().end());
      prefill.push_back({item.seq_id(), prompts.back()});
      row = static_cast<int64_t>(prefill.size()) - 1;
    }
    if (item.partial()) continue;  // its sampling parameters come again with its last chunk
    // The token drawn sits right after the prompt; sample k of n uses seed + k.
    const uint64_t counter = static_cast<uint64_t>(item.start_position()) + item.tokens_size();
    const SamplingParams params = SamplingFromProto(item.sampling());
    absl::StatusOr<std::optional<TokenHistory>> history = PromptHistory(item, params);
    if (!history.ok()) return fail(history.status());
    std::vector<int64_t> samples = {item.seq_id()};
    samples.insert(samples.end(), item.fork_seq_ids().begin(), item.fork_seq_ids().end());
    for (size_t k = 0; k < samples.size(); ++k) {
      SequenceSampling own{params, *history ? std::make_unique<TokenHistory>(**history) : nullptr};
      own.params.seed = params.seed + k;
      std::vector<TokenDraw>& draws = continues ? decode_draws : prefill_draws;
      order.push_back({samples[k], !continues, draws.size()});
      draws.push_back({row, own.params, counter, own.history.get()});
      new_sampling.emplace_back(samples[k], std::move(own));
    }
  }
  {
    std::lock_guard<std::mutex> lock(sampling_mu_);
    for (int i = 0; i < plan.decode_size(); ++i) {
      const auto& item = plan.decode(i);
      auto it = sampling_.find(item.seq_id());
      SamplingParams params;
      TokenHistory* history = nullptr;
      if (it != sampling_.end()) {
        params = it->second.params;
        history = it->second.history.get();
        if (history != nullptr) history->Add(item.position(), item.token());  // the token fed back
      }
      order.push_back({item.seq_id(), false, decode_draws.size()});
      decode_draws.push_back({i, params, static_cast<uint64_t>(item.position()) + 1, history});
    }
  }

  absl::StatusOr<SliceRelay*> relay = RelayFor(plan);
  if (!relay.ok()) return fail(relay.status());
  if (*relay != nullptr) (*relay)->BeginStep(plan.step_id());
  rotating = *relay;
  engine->set_handoff(*relay);  // every plan sets it (null: no rotation) before the engine runs

  std::vector<int32_t> prefill_tokens(prefill_draws.size()), decode_tokens(decode_draws.size());
  std::vector<TokenLogprobs> prefill_logprobs(prefill_draws.size()), decode_logprobs(decode_draws.size());
  if (!prefill.empty()) {
    absl::Status status = engine->Prefill(prefill, prefill_draws, prefill_tokens.data(), prefill_logprobs.data());
    if (!status.ok()) return fail(status);
  }
  if (!decode.empty()) {
    absl::Status status = engine->Decode(decode, decode_draws, decode_tokens.data(), decode_logprobs.data());
    if (!status.ok()) return fail(status);
  }
  if (rotating != nullptr) rotating->EndStep();
  {
    std::lock_guard<std::mutex> lock(sampling_mu_);
    for (auto& [seq, sampling] : new_sampling) sampling_.insert_or_assign(seq, std::move(sampling));
  }
  if (!engine->RunsLastSlice()) return result;  // another compute node drew the tokens
  for (const Slot& slot : order) {
    auto* token = result.add_tokens();
    token->set_seq_id(slot.seq);
    token->set_token(slot.from_prefill ? prefill_tokens[slot.draw] : decode_tokens[slot.draw]);
    const TokenDraw& draw = slot.from_prefill ? prefill_draws[slot.draw] : decode_draws[slot.draw];
    if (draw.params.wants_logprobs()) {
      ToProto(slot.from_prefill ? prefill_logprobs[slot.draw] : decode_logprobs[slot.draw], token->mutable_logprobs());
    }
  }
  return result;
}

void StepService::Abandon(const lamina::v1::StepPlan& plan, int runner) {
  PlacedAttention* attention = runners_[runner].parts.attention;
  std::lock_guard<std::mutex> lock(sampling_mu_);
  auto forget = [&](int64_t seq) {
    attention->Free(seq);
    sampling_.erase(seq);
  };
  for (const auto& item : plan.prefill()) {
    forget(item.seq_id());
    for (int64_t fork : item.fork_seq_ids()) forget(fork);
  }
  for (const auto& item : plan.decode()) forget(item.seq_id());
}

grpc::Status StepService::Step(grpc::ServerContext* context,
                               grpc::ServerReaderWriter<lamina::v1::StepResult, lamina::v1::StepPlan>* stream) {
  // Before a runner is held: a stranger's stream may not take the node's only runner.
  if (grpc::Status auth = CheckClusterAuth(*context, secret_); !auth.ok()) return auth;
  const std::optional<int> runner = HoldRunner(context);
  if (!runner) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled while waiting for a free runner");
  lamina::v1::StepPlan plan;
  while (!context->IsCancelled() && stream->Read(&plan)) {
    lamina::v1::StepResult result = RunPlan(plan, *runner);
    if (context->IsCancelled() || !stream->Write(result)) {
      // The coordinator gave up on this step (the node was declared dead, or the step timed out)
      // and has ended these sequences: undo what the late step put on the memory nodes.
      Abandon(plan, *runner);
      break;
    }
  }
  ReleaseRunner(*runner);
  return grpc::Status::OK;
}

}  // namespace lamina
