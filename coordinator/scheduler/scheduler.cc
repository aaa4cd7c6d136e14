#include "coordinator/scheduler/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status/status_macros.h"
#include "compute_node/sampling/sampling_proto.h"
#include "coordinator/scheduler/prefill_budget.h"
#include "coordinator/scheduler/replica_results.h"

namespace lamina {
namespace {

// Every node holding KV caches serves lamina.v1.MemoryNode (frees and forks) on its gRPC port.
// Each KV pool's gRPC addresses: a group's nodes (tensor-parallel ranks, a layer split) all hold
// their share of it.
std::map<std::string, std::vector<std::string>> KvGrpcAddresses(const Topology& topology) {
  std::map<std::string, std::vector<std::string>> out;
  for (const NodeSpec* node : topology.KvNodes()) {
    for (const NodeSpec* member : topology.PoolMembers(node->name)) out[node->name].push_back(member->grpc_address());
  }
  return out;
}

}  // namespace

Scheduler::Scheduler(const Topology& topology, const ModelConfig& config, const Tokenizer* tokenizer,
                     Membership* membership, std::unique_ptr<AdmissionPolicy> policy,
                     const std::optional<ClusterSecret>& secret)
    : topology_(topology),
      config_(config),
      tokenizer_(tokenizer),
      membership_(membership),
      memory_(KvGrpcAddresses(topology), secret),
      policy_(policy ? std::move(policy) : std::make_unique<FifoPolicy>()) {
  const std::vector<const NodeSpec*> first_nodes = topology.BatchComputeNodes();
  for (size_t j = 0; j < first_nodes.size(); ++j) {
    if (topology.RotationReplicas() > 0) {
      batches_.push_back(std::make_unique<Batch>(static_cast<int>(j), topology.NodesOf(NodeKind::kCompute), secret));
      batches_.back()->rotation_replicas = topology.RotationReplicas();
    } else {
      // A tensor-parallel group's ranks all run each plan.
      batches_.push_back(std::make_unique<Batch>(static_cast<int>(j), topology.RanksOf(first_nodes[j]->name), secret));
    }
  }
  batch_ = batches_[0].get();
  if (topology.stagger) stagger_ = std::make_unique<StepStagger>(static_cast<int>(batches_.size()), config.num_layers);
  loop_ = std::thread([this] { Loop(); });
  watchdog_ = std::thread([this] { Watchdog(); });
}

int64_t Scheduler::SlotsNeeded(const GenerationSpec& spec) const {
  const int64_t prompt = static_cast<int64_t>(spec.prompt.size());
  const int64_t per_sample = std::min<int64_t>(spec.stop.max_tokens, config_.max_position_embeddings - prompt);
  return prompt + spec.n * std::max<int64_t>(per_sample, 0);
}

Scheduler::Batch::Batch(int batch_index, const std::vector<const NodeSpec*>& nodes,
                        const std::optional<ClusterSecret>& secret)
    : index(batch_index) {
  for (const NodeSpec* node : nodes) {
    compute_nodes.push_back(node->name);
    computes.push_back(std::make_unique<ComputeClient>(node->name, node->grpc_address(), secret));
  }
}

std::string Scheduler::Batch::DeadComputeNode(const Membership& membership) const {
  for (const std::string& node : compute_nodes) {
    if (!membership.IsAlive(node)) return node;
  }
  return "";
}

bool Scheduler::Batch::Uses(const std::string& compute_node) const {
  return std::find(compute_nodes.begin(), compute_nodes.end(), compute_node) != compute_nodes.end();
}

void Scheduler::Batch::Abort() {
  for (const std::unique_ptr<ComputeClient>& compute : computes) compute->Abort();
}

void Scheduler::Watchdog() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (wake_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping_; })) return;
    }
    for (const std::unique_ptr<Batch>& batch : batches_) {
      const int64_t started = batch->step_started_ms.load();
      if (started != 0 && absl::ToUnixMillis(absl::Now()) - started > topology_.step_timeout_ms) {
        batch->step_started_ms = 0;
        batch->Abort();  // Receive returns Unavailable and the batch ends
      }
    }
  }
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (const std::unique_ptr<Batch>& batch : batches_) batch->Abort();
  loop_.join();
  watchdog_.join();
}

absl::StatusOr<std::shared_ptr<RequestHandle>> Scheduler::Submit(GenerationSpec spec) {
  absl::StatusOr<std::shared_ptr<RequestHandle>> handle = Enqueue(std::move(spec));
  if (!handle.ok()) metrics_.Refused(handle.status().code());
  return handle;
}

absl::StatusOr<std::shared_ptr<RequestHandle>> Scheduler::Enqueue(GenerationSpec spec) {
  const int64_t n = static_cast<int64_t>(spec.prompt.size());
  if (n == 0) return absl::InvalidArgumentError("the prompt is empty");
  if (n >= config_.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", n, " tokens; the model's context is ",
                                                   config_.max_position_embeddings, " tokens"));
  }
  for (int32_t id : spec.prompt) {
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is outside the vocabulary (0..",
                                                     config_.vocab_size - 1, ")"));
    }
  }
  if (spec.stop.max_tokens < 1) return absl::InvalidArgumentError("max_tokens must be at least 1");
  if (spec.n < 1 || spec.n > 64) return absl::InvalidArgumentError(absl::StrCat("n must be from 1 to 64, got ", spec.n));
  LAMINA_RETURN_IF_ERROR(spec.sampling.Validate());

  // Will it ever fit? Compare with the largest live memory node.
  int64_t largest = 0;
  bool compute_alive = false;
  for (const MemberInfo& m : membership_->Snapshot()) {
    if (!m.alive()) continue;
    if (m.spec.holds_kv()) largest = std::max(largest, m.kv_capacity_slots);
    if (m.spec.kind == NodeKind::kCompute) compute_alive = true;
  }
  if (!compute_alive || largest == 0) {
    std::string why;
    membership_->AllAlive(&why);
    return absl::UnavailableError(absl::StrCat("the cluster cannot serve: ", why));
  }
  const int64_t need = SlotsNeeded(spec);
  if (need > largest) {
    return absl::ResourceExhaustedError(absl::StrCat("the request needs ", need, " KV slots (prompt ", n, " + ", spec.n,
                                                     " x max_tokens ", spec.stop.max_tokens,
                                                     "); the largest KV pool has ", largest));
  }

  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || draining_) return absl::UnavailableError("the coordinator is shutting down");
  auto handle = std::make_shared<RequestHandle>(next_id_++);
  queued_specs_[handle->id()] = std::move(spec);
  queue_.push_back(handle);
  wake_.notify_all();
  return handle;
}

bool Scheduler::Drain(absl::Duration grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    // Not admitted yet: they end now, and a client may send them elsewhere.
    for (auto& handle : queue_) EndQueued(*handle, absl::UnavailableError("the coordinator is shutting down"));
    queue_.clear();
  }
  wake_.notify_all();
  const absl::Time deadline = absl::Now() + grace;
  uint64_t first_pass;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first_pass = passes_;
  }
  for (;;) {
    {
      // Counted by a whole pass of the loop begun since draining started.
      std::lock_guard<std::mutex> lock(mu_);
      if (passes_ >= first_pass + 2 && in_flight_ == 0) return true;
    }
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void Scheduler::OnNodeDeath(const std::string& node) {
  for (const std::unique_ptr<Batch>& batch : batches_) {
    if (batch->Uses(node)) batch->Abort();
  }
  wake_.notify_all();
}

SchedulerStats Scheduler::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerStats stats;
  stats.queued = static_cast<int64_t>(queue_.size());
  for (int64_t running : running_per_batch_) stats.running += running;
  stats.completed = completed_;
  stats.failed = failed_;
  stats.cancelled = cancelled_;
  stats.cached = cached_;
  stats.preemptions = preemptions_;
  stats.iterations = iterations_;
  stats.decoded_sequences = decoded_sequences_;
  stats.prefilled_tokens = prefilled_tokens_;
  stats.iteration_seconds = iteration_seconds_;
  stats.running_per_batch = running_per_batch_;
  const absl::Time now = absl::Now();
  int64_t tokens = 0;
  for (const auto& [when, count] : recent_tokens_) {
    if (now - when <= absl::Seconds(5)) tokens += count;
  }
  stats.tokens_per_second = tokens / 5.0;
  return stats;
}

void Scheduler::RecordTokens(int64_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = absl::Now();
  recent_tokens_.emplace_back(now, count);
  while (!recent_tokens_.empty() && now - recent_tokens_.front().first > absl::Seconds(5)) recent_tokens_.pop_front();
}

void Scheduler::EndQueued(RequestHandle& handle, const absl::Status& error) {
  ++(absl::IsCancelled(error) ? cancelled_ : failed_);
  const int64_t prompt = static_cast<int64_t>(queued_specs_[handle.id()].prompt.size());
  metrics_.RequestEnded(error.code(), absl::Now() - handle.submitted(), prompt, 0);
  queued_specs_.erase(handle.id());
  RequestEvent event;
  event.done = true;
  event.error = error;
  handle.Push(std::move(event));
}

void Scheduler::Finish(Sequence& seq, FinishReason reason, const absl::Status& error, RequestEvent last,
                       bool slots_freed) {
  RequestState& request = *seq.request;
  // Samples that were never forked (sample 0 ended before its prefill) end with it.
  request.running_samples -= 1 + static_cast<int32_t>(seq.forks.size());
  const bool last_sample = request.running_samples == 0;
  // The client hears last, once the slots are freed and the request counted, so that what it
  // reads from `lamina status` afterwards already reflects this request.
  std::optional<RequestEvent> to_client;
  if (error.ok() && !request.failed) {
    if (seq.text) last.text += seq.text->Finish();
    last.index = seq.index;
    last.finish = reason;
    last.prompt_tokens = static_cast<int32_t>(request.spec.prompt.size());
    last.generated_tokens = seq.generated;
    last.done = last_sample;
    to_client = std::move(last);
    metrics_.SampleFinished(FinishReasonName(reason));
  } else if (!error.ok() && !request.failed) {
    request.failed = true;  // one error ends the request for the client; later samples add nothing
    request.error = error.code();
    to_client = RequestEvent();
    to_client->done = true;
    to_client->error = error;
  }
  batch_->release.push_back(seq.seq_id);
  if (!slots_freed) FreeSlots(request.memory_node, {seq.seq_id});
  request.generated += seq.generated;
  if (last_sample) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      (!request.failed ? completed_ : request.error == absl::StatusCode::kCancelled ? cancelled_ : failed_)++;
    }
    metrics_.RequestEnded(request.error, absl::Now() - request.handle->submitted(),
                          static_cast<int64_t>(request.spec.prompt.size()), request.generated);
  }
  if (to_client) request.handle->Push(std::move(*to_client));
}

void Scheduler::FreeSlots(const std::string& node, const std::vector<int64_t>& seq_ids) {
  if (seq_ids.empty()) return;
  if (!membership_->IsAlive(node)) {
    std::vector<int64_t>& orphans = orphaned_[node];
    orphans.insert(orphans.end(), seq_ids.begin(), seq_ids.end());
    return;
  }
  absl::StatusOr<lamina::v1::FreeSequencesResponse> report = memory_.Free(node, seq_ids);
  if (report.ok()) {
    membership_->SetKvUse(node, report->kv_free_slots(), report->num_sequences());
    return;
  }
  // The message names the node.
  std::fprintf(stderr, "coordinator: %zu sequence%s not freed: %s\n", seq_ids.size(), seq_ids.size() == 1 ? "" : "s",
               std::string(report.status().message()).c_str());
}

void Scheduler::FailAll(const absl::Status& error) {
  // One call per memory node before the requests end: a node slow to answer then delays the
  // batch's failure once, not once per sequence.
  std::map<std::string, std::vector<int64_t>> by_node;
  for (const Sequence& seq : batch_->running) by_node[seq.request->memory_node].push_back(seq.seq_id);
  for (const auto& [node, ids] : by_node) FreeSlots(node, ids);
  for (Sequence& seq : batch_->running) Finish(seq, FinishReason::kNone, error, {}, /*slots_freed=*/true);
  batch_->running.clear();
}

void Scheduler::FailEverything(const absl::Status& error) {
  for (const std::unique_ptr<Batch>& batch : batches_) {
    batch_ = batch.get();
    FailAll(error);
    FailPreempted(error);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& handle : queue_) EndQueued(*handle, error);
  queue_.clear();
  running_per_batch_.assign(batches_.size(), 0);
}

void Scheduler::FailPreempted(const absl::Status& error) {
  for (std::vector<Sequence>& samples : batch_->preempted) {
    for (Sequence& seq : samples) Finish(seq, FinishReason::kNone, error);
  }
  batch_->preempted.clear();
}

void Scheduler::FreeOrphans() {
  for (auto it = orphaned_.begin(); it != orphaned_.end();) {
    if (!membership_->IsAlive(it->first)) {
      ++it;
      continue;
    }
    const std::vector<int64_t> seq_ids = std::move(it->second);
    const std::string node = it->first;
    it = orphaned_.erase(it);
    FreeSlots(node, seq_ids);  // unknown ids (a restarted node) are ignored there
  }
}

void Scheduler::EndDeadAndCancelled() {
  for (const MemberInfo& m : membership_->Snapshot()) {
    if (!m.spec.holds_kv() || !m.dead) continue;
    const std::vector<SequenceId> cached = prefix_cache_.DropNode(m.spec.name);
    std::vector<int64_t>& orphans = orphaned_[m.spec.name];
    orphans.insert(orphans.end(), cached.begin(), cached.end());
  }
  FreeOrphans();
  std::vector<Sequence> keep, lost;
  for (Sequence& seq : batch_->running) {
    if (seq.request->handle->cancelled()) {
      Finish(seq, FinishReason::kNone, absl::CancelledError("cancelled by the client"));
    } else if (!membership_->IsAlive(seq.request->memory_node)) {
      lost.push_back(std::move(seq));  // its KV cache died with the node: recomputed elsewhere
    } else {
      keep.push_back(std::move(seq));
    }
  }
  batch_->running = std::move(keep);
  Migrate(std::move(lost), batch_, absl::StrCat("its KV pool's node died"));
}

void Scheduler::Migrate(std::vector<Sequence> sequences, Batch* to, const std::string& why) {
  // A request's samples move together, in the order they were admitted.
  std::map<uint64_t, std::vector<Sequence>> by_request;
  for (Sequence& seq : sequences) by_request[seq.request->admitted].push_back(std::move(seq));
  for (auto it = by_request.rbegin(); it != by_request.rend(); ++it) {
    std::vector<Sequence>& samples = it->second;
    RequestState& request = *samples[0].request;
    const std::string node = request.memory_node;
    std::vector<int64_t> ids;
    for (const Sequence& seq : samples) ids.push_back(seq.seq_id);
    FreeSlots(node, ids);  // a dead node's are kept for when it registers again
    if (request.migrations >= topology_.max_migrations) {
      metrics_.Migration(false);
      const absl::Status error = absl::UnavailableError(
          absl::StrCat("node '", node, "' holding this request failed (", why, ") and it was moved ",
                       request.migrations, " times already, the limit (scheduler.max_migrations)"));
      for (Sequence& seq : samples) Finish(seq, FinishReason::kNone, error, {}, /*slots_freed=*/true);
      continue;
    }
    ++request.migrations;
    metrics_.Migration(true);
    std::fprintf(stderr, "coordinator: request %llu moves off '%s' (%s): recomputed on a surviving pool\n",
                 static_cast<unsigned long long>(request.handle->id()), node.c_str(), why.c_str());
    for (Sequence& seq : samples) {
      seq.prefilled = false;
      seq.resume = !seq.output.empty();
      seq.start_position = 0;
      seq.chunk = 0;
    }
    to->preempted.push_front(std::move(samples));  // before requests preempted for room
  }
}

lamina::v1::StepPlan Scheduler::BuildPlan() {
  lamina::v1::StepPlan plan;
  plan.set_step_id(++batch_->step_id);
  if (batch_->rotation_replicas > 0) {
    plan.set_rotation_replicas(batch_->rotation_replicas);
    plan.set_rotation_batch(batch_->index);
  }
  for (int64_t seq : batch_->release) plan.add_release(seq);
  batch_->release.clear();
  int64_t decodes = 0;
  for (const Sequence& seq : batch_->running) decodes += seq.prefilled ? 1 : 0;
  PrefillBudget prompts(topology_.max_tokens_per_iteration, decodes, topology_.chunked_prefill);
  for (Sequence& seq : batch_->running) {
    const GenerationSpec& spec = seq.request->spec;
    if (!seq.prefilled) {
      const int64_t rest = PrefillLength(seq) - seq.start_position;
      const int64_t chunk = prompts.Take(rest);
      seq.chunk = static_cast<int32_t>(chunk);
      if (chunk == 0) continue;  // no budget left this step
      auto* item = plan.add_prefill();
      item->set_seq_id(seq.seq_id);
      // The prompt, and for a resumed sample its output too: everything it had is recomputed.
      const int64_t prompt = static_cast<int64_t>(spec.prompt.size());
      for (int64_t t = seq.start_position; t < seq.start_position + chunk; ++t) {
        item->add_tokens(t < prompt ? spec.prompt[t] : seq.output[t - prompt]);
      }
      item->set_start_position(seq.start_position);
      item->set_resume(seq.resume);
      item->set_memory_node(seq.request->memory_node);
      // Sample k of n draws with seed + k: the compute node adds k for the forks of sample 0; a
      // resumed sample comes alone and carries its own.
      SamplingParams sampling = spec.sampling;
      sampling.seed += seq.resume ? seq.index : 0;
      SamplingToProto(sampling, item->mutable_sampling());
      if (chunk < rest) {
        item->set_partial(true);  // the forks come with the last chunk
      } else {
        for (SequenceId fork : seq.forks) item->add_fork_seq_ids(fork);
        if (sampling.has_penalties()) {  // the penalties count the tokens the compute node did not see
          for (int64_t t = 0; t < seq.start_position; ++t) {
            item->add_context_tokens(t < prompt ? spec.prompt[t] : seq.output[t - prompt]);
          }
        }
      }
      if (sampling.has_penalties()) item->set_prompt_length(static_cast<int32_t>(prompt));
    } else {
      auto* item = plan.add_decode();
      item->set_seq_id(seq.seq_id);
      item->set_token(seq.last_token);
      item->set_position(seq.next_position);
      item->set_memory_node(seq.request->memory_node);
    }
  }
  return plan;
}

std::vector<Scheduler::Sequence> Scheduler::ForkSamples(Sequence& first) {
  std::vector<Sequence> forks;
  const int32_t prompt = static_cast<int32_t>(first.request->spec.prompt.size());
  for (size_t k = 0; k < first.forks.size(); ++k) {
    Sequence fork;
    fork.request = first.request;
    fork.seq_id = first.forks[k];
    fork.index = static_cast<int32_t>(k + 1);
    fork.prefilled = true;
    fork.next_position = prompt;
    fork.text = std::make_unique<TextStream>(tokenizer_, first.request->spec.stop_strings);
    absl::Status forked = memory_.Fork(first.request->memory_node, first.seq_id, fork.seq_id, prompt);
    if (!forked.ok()) {
      Finish(fork, FinishReason::kNone, forked);
      continue;
    }
    forks.push_back(std::move(fork));
  }
  first.forks.clear();
  return forks;
}

bool Scheduler::Advance(Sequence& seq, const lamina::v1::SampledToken& sampled) {
  const int32_t token = sampled.token();
  const GenerationSpec& spec = seq.request->spec;
  seq.last_token = token;
  seq.output.push_back(token);
  ++seq.generated;
  const absl::Time now = absl::Now();
  std::optional<absl::Duration> first, gap;
  if (!seq.request->first_token) {
    seq.request->first_token = true;
    first = now - seq.request->handle->submitted();
  } else if (seq.last_token_at != absl::InfinitePast()) {
    gap = now - seq.last_token_at;
  }
  seq.last_token_at = now;
  metrics_.Token(first, gap);
  RequestEvent event;
  event.index = seq.index;
  event.token_ids.push_back(token);
  if (spec.sampling.wants_logprobs()) event.logprobs.push_back(sampled.logprobs());
  bool stopped = false;
  event.text = seq.text->Add(token, &stopped, seq.generated >= spec.stop.min_tokens);
  const FinishReason finish =
      stopped ? FinishReason::kStopString : CheckFinish(token, seq.generated, seq.next_position, spec.stop, config_);
  if (finish != FinishReason::kNone) {
    Finish(seq, finish, absl::OkStatus(), std::move(event));
    return false;
  }
  if (!seq.request->failed) seq.request->handle->Push(std::move(event));
  return true;
}

void Scheduler::ApplyResult(const lamina::v1::StepResult& result) {
  std::map<int64_t, const lamina::v1::SampledToken*> tokens;
  for (const auto& t : result.tokens()) tokens[t.seq_id()] = &t;
  std::vector<Sequence> keep;
  auto take = [&](Sequence seq) {
    auto it = tokens.find(seq.seq_id);
    if (it == tokens.end()) {
      Finish(seq, FinishReason::kNone, absl::InternalError("the compute node returned no token for this request"));
    } else if (Advance(seq, *it->second)) {
      keep.push_back(std::move(seq));
    }
  };
  for (Sequence& seq : batch_->running) {
    if (seq.prefilled) {
      ++seq.next_position;
      take(std::move(seq));
      continue;
    }
    if (seq.start_position + seq.chunk < PrefillLength(seq)) {  // a chunk short of the end, or none
      seq.start_position += seq.chunk;
      seq.chunk = 0;
      keep.push_back(std::move(seq));
      continue;
    }
    if (seq.resume) {  // recomputed: the token continues where the sample left off
      seq.prefilled = true;
      seq.resume = false;
      seq.next_position = static_cast<int32_t>(seq.request->spec.prompt.size() + seq.output.size());
      take(std::move(seq));
      continue;
    }
    seq.prefilled = true;
    seq.next_position = static_cast<int32_t>(seq.request->spec.prompt.size());
    // Fork first: sample 0 may finish at once and free its slots, which the forks and the prefix
    // cache share.
    std::vector<Sequence> forks = ForkSamples(seq);
    CachePrompt(seq);
    take(std::move(seq));
    for (Sequence& fork : forks) take(std::move(fork));
  }
  RecordTokens(static_cast<int64_t>(tokens.size()));
  batch_->running = std::move(keep);
}

void Scheduler::Loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(50), [&] {
        if (stopping_ || !queue_.empty()) return true;
        for (const std::unique_ptr<Batch>& batch : batches_) {
          if (batch->in_flight || !batch->running.empty() || !batch->preempted.empty()) return true;
        }
        return false;
      });
      if (stopping_) break;
    }
    // Each batch in turn: collect its step, send its next one, and move on while it runs.
    for (const std::unique_ptr<Batch>& batch : batches_) {
      batch_ = batch.get();
      if (batch_->in_flight) Collect();
      Prepare();
    }
    std::vector<int64_t> per_batch;
    int64_t in_flight = 0;
    for (const std::unique_ptr<Batch>& batch : batches_) {
      per_batch.push_back(static_cast<int64_t>(batch->running.size()));
      in_flight += static_cast<int64_t>(batch->running.size() + batch->preempted.size());
    }
    std::map<std::string, PrefixCache::Use> cached = prefix_cache_.Usage();
    std::lock_guard<std::mutex> lock(mu_);
    running_per_batch_ = std::move(per_batch);
    cached_ = std::move(cached);
    in_flight_ = in_flight;
    ++passes_;
  }
  for (const std::unique_ptr<Batch>& batch : batches_) {
    batch_ = batch.get();
    if (batch_->in_flight) Collect();  // aborted by the destructor: ends at once
  }
  FailEverything(absl::UnavailableError(
      draining_ ? absl::StrCat("the coordinator stopped before this request finished (scheduler.shutdown_grace_s, ",
                               topology_.shutdown_grace_s, " s)")
                : std::string("the coordinator is shutting down")));
}

Scheduler::Batch* Scheduler::LiveBatch() const {
  if (topology_.RotationReplicas() > 0) return nullptr;  // every batch runs on every compute node
  Batch* best = nullptr;
  for (const std::unique_ptr<Batch>& batch : batches_) {
    if (batch.get() == batch_ || !batch->DeadComputeNode(*membership_).empty()) continue;
    if (best == nullptr || batch->running.size() < best->running.size()) best = batch.get();
  }
  return best;
}

absl::Status Scheduler::DeadComputeNodeError() const {
  const std::string dead_node = batch_->DeadComputeNode(*membership_);
  if (dead_node.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "compute node '", dead_node, "' is not alive",
      batch_->rotation_replicas > 0 ? " (rotational pipelining runs every batch through every compute node)" : ""));
}

void Scheduler::Prepare() {
  EndDeadAndCancelled();
  if (const absl::Status dead = DeadComputeNodeError(); !dead.ok()) {
    // Its requests move to a batch whose compute nodes live (`fixed` over several compute nodes),
    // recomputed there; with none, they fail.
    if (Batch* survivor = LiveBatch(); survivor != nullptr) {
      std::vector<Sequence> running = std::move(batch_->running);
      batch_->running.clear();
      Migrate(std::move(running), survivor, std::string(dead.message()));
      for (std::vector<Sequence>& samples : batch_->preempted) survivor->preempted.push_back(std::move(samples));
      batch_->preempted.clear();
      return;
    }
    FailAll(dead);
    FailPreempted(dead);
    // Queued requests wait for a batch on live compute nodes; with none left they fail.
    bool any_alive = false;
    for (const std::unique_ptr<Batch>& batch : batches_) any_alive |= batch->DeadComputeNode(*membership_).empty();
    if (!any_alive) FailEverything(dead);
    return;
  }
  WithdrawUnpaidOffload();
  Admit();
  PreemptWhereFull();
  if (batch_->running.empty()) return;

  batch_->plan = BuildPlan();
  if (stagger_) {
    const absl::Duration hold = stagger_->Hold(batch_->index, absl::Now());
    if (hold > absl::ZeroDuration()) absl::SleepFor(hold);
  }
  batch_->step_start = absl::Now();
  if (stagger_) stagger_->Sent(batch_->index, batch_->step_start);
  batch_->step_started_ms = absl::ToUnixMillis(batch_->step_start);
  for (const std::unique_ptr<ComputeClient>& compute : batch_->computes) compute->Send(batch_->plan);
  batch_->in_flight = true;
}

absl::StatusOr<lamina::v1::StepResult> Scheduler::ReceiveResult(std::vector<std::string>* broken) {
  std::vector<absl::StatusOr<lamina::v1::StepResult>> results;
  for (size_t i = 0; i < batch_->computes.size(); ++i) {
    results.push_back(batch_->computes[i]->Receive());
    if (!results.back().ok()) broken->push_back(batch_->compute_nodes[i]);
  }
  // The tokens: from the node that ran the last slice, or a tensor-parallel group's rank 0.
  int last = batch_->computes.size() > 1 ? 0 : -1;
  if (batch_->rotation_replicas > 0) last = topology_.RouteOf(batch_->index, 0).OwnerOf(config_.num_layers);
  return MergeReplicaResults(results, last);
}

void Scheduler::Collect() {
  std::vector<std::string> broken;
  absl::StatusOr<lamina::v1::StepResult> result = ReceiveResult(&broken);
  batch_->in_flight = false;
  const bool timed_out = batch_->step_started_ms.exchange(0) == 0;
  const lamina::v1::StepPlan& plan = batch_->plan;
  {
    std::lock_guard<std::mutex> lock(mu_);
    iteration_seconds_ += absl::ToDoubleSeconds(absl::Now() - batch_->step_start);
    if (result.ok() && result->error_code() == 0) {
      if (plan.prefill_size() == 0) {
        if (stagger_) stagger_->DecodeStepTook(absl::Now() - batch_->step_start);
        RecordDecodePace(plan, absl::ToDoubleSeconds(absl::Now() - batch_->step_start));
      }
      ++iterations_;
      decoded_sequences_ += plan.decode_size();
      for (const auto& item : plan.prefill()) prefilled_tokens_ += item.tokens_size();
    }
  }
  if (!result.ok() && timed_out) {
    result = absl::UnavailableError(absl::StrCat("compute node '", absl::StrJoin(batch_->compute_nodes, "', '"),
                                                 "' did not finish an iteration in ", topology_.step_timeout_ms, " ms"));
  }
  const bool failed = !result.ok() || result->error_code() != 0;
  if (const absl::Status dead = DeadComputeNodeError(); failed && !dead.ok()) {
    // A compute node's death fails the step everywhere in its batch: the others' streams are
    // cancelled, and their waits on it give up. Blame no memory node: the next Prepare moves the
    // batch's requests to a live batch, or fails them naming the dead node.
    return;
  }
  if (!result.ok()) {
    if (!timed_out && !broken.empty()) {
      // The nodes' streams broke: their processes are gone or unreachable (a tensor-parallel
      // group's other ranks answer, failing the step). They are declared dead now, not at their
      // heartbeat timeout, so that no request is admitted to this batch meanwhile (and, with no
      // other batch, the queued ones fail at once). A node that is in fact alive registers again
      // on its next heartbeat.
      for (const std::string& node : broken) membership_->MarkDead(node, std::string(result.status().message()));
      if (!DeadComputeNodeError().ok()) return;  // Prepare moves or fails its requests
    }
    FailAll(result.status());
    return;
  }
  if (result->error_code() != 0) {
    if (result->failed_memory_nodes_size() > 0) {
      // Their sequences end when the batch is prepared again; the others run the same step again.
      for (const lamina::v1::FailedMemoryNode& node : result->failed_memory_nodes()) {
        membership_->MarkDead(node.name(), absl::StrCat("unreachable from the compute node: ", node.reason()));
      }
      return;
    }
    // Requests were checked when submitted: a step's failure is never the client's, whatever code
    // the node gave it (an OpenAI client must not read it as "do not retry").
    absl::StatusCode code = static_cast<absl::StatusCode>(result->error_code());
    if (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded) {
      code = absl::StatusCode::kInternal;
    }
    FailAll(absl::Status(code, absl::StrCat("the compute node failed the step: ", result->error_message())));
    return;
  }
  ApplyResult(*result);
}

}  // namespace lamina
