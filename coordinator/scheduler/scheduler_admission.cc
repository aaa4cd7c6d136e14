// Scheduler's admission and placement: which queued requests join the batch, on which KV pool
// each sequence lives, and preemption when a pool fills (scheduler.h states the contracts).
#include "coordinator/scheduler/scheduler.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "coordinator/scheduler/balanced_placement.h"

namespace lamina {

void Scheduler::Admit() {
  // What the batch's next step leaves of the token budget: its decodes, and the prompt tokens
  // still to prefill.
  int64_t budget = topology_.max_tokens_per_iteration;
  bool prefilling = false;
  for (const Sequence& seq : batch_->running) {
    budget -= seq.prefilled ? 1 : PrefillLength(seq) - seq.start_position;
    prefilling |= !seq.prefilled;
  }
  int64_t admitted_tokens = 0;
  const std::vector<MemberInfo> members = membership_->Snapshot();
  auto end_waiting = [&](size_t index, const absl::Status& error) {  // mu_ held
    EndQueued(*queue_[index], error);
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(index));
  };

  std::map<std::string, int64_t> row_room = BalancedRowRoom(members);
  if (!ResumePreempted(&row_room)) return;  // preempted requests go first
  std::map<std::string, int64_t> use;
  for (const MemberInfo& m : members) use[m.spec.name] = NodeUse(m.spec.name);

  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = queue_.size(); i-- > 0;) {
    if (queue_[i]->cancelled()) end_waiting(i, absl::CancelledError("cancelled by the client"));
  }
  // Only the batches taking requests now (under `auto` at low load, the first alone), each up to
  // the batch limit and its share of what runs or waits, so that they stay about equal in size.
  int64_t sequences = 0;
  for (const std::unique_ptr<Batch>& batch : batches_) sequences += static_cast<int64_t>(batch->running.size());
  const int64_t pending = sequences + static_cast<int64_t>(queue_.size());
  const int64_t sharing = topology_.SecondBatchOnDemand() && pending <= topology_.rotational_above
                              ? 1
                              : static_cast<int64_t>(batches_.size());
  if (batch_ != batches_[0].get() && sharing == 1) return;
  const int64_t limit = std::min<int64_t>(topology_.max_batch, (pending + sharing - 1) / sharing);
  while (!queue_.empty() && static_cast<int64_t>(batch_->running.size()) < limit) {
    std::vector<WaitingRequest> waiting;
    for (const auto& handle : queue_) {
      const GenerationSpec& spec = queued_specs_[handle->id()];
      waiting.push_back({handle->id(), static_cast<int64_t>(spec.prompt.size()), SlotsNeeded(spec)});
    }
    const std::optional<size_t> pick = policy_->Next(waiting);
    if (!pick || *pick >= waiting.size()) return;
    const WaitingRequest& candidate = waiting[*pick];
    if (topology_.chunked_prefill) {
      // Admitted while any budget is left (its prompt then goes in chunks as the budget allows),
      // or, with none left, when no other prompt is being prefilled (a step takes at least a
      // chunk of the first one).
      if (budget - admitted_tokens <= 0 && (prefilling || admitted_tokens > 0)) return;
    } else if (admitted_tokens > 0 && admitted_tokens + candidate.prompt_tokens > budget) {
      return;  // a prompt larger than the budget still runs, alone, so that nothing starves
    }

    // The live memory node holding the longest cached prefix of the prompt, among those with
    // room once their cached prefixes give way; otherwise the one with the most room.
    // Admission needs room for the prompt and each sample's first token now; the sequences grow
    // into free slots later, and preemption makes room if a node runs dry.
    const MemberInfo* best = nullptr;
    int64_t best_match = -1, best_room = -1, largest = 0;
    const GenerationSpec& candidate_spec = queued_specs_[candidate.id];
    const std::vector<int32_t>& prompt = candidate_spec.prompt;
    const int64_t need_now = static_cast<int64_t>(prompt.size()) + candidate_spec.n;
    int best_rank = 0;
    for (const MemberInfo& m : members) {
      if (!MayHold(m)) continue;
      largest = std::max(largest, m.kv_capacity_slots);
      const int64_t room = m.kv_capacity_slots - use[m.spec.name];  // cached prefixes give way
      if (room < need_now) continue;
      if (auto rows = row_room.find(m.spec.name); rows != row_room.end() && rows->second < candidate_spec.n) {
        continue;  // balanced: it attends all the rows it can within the compute node's step
      }
      int64_t match = 0;
      if (topology_.prefix_caching) {
        auto hit = prefix_cache_.Longest(m.spec.name, prompt);
        if (hit) match = hit->length;
      }
      const int rank = PlacementRank(m, room, candidate.kv_slots_needed);
      if (best == nullptr || rank < best_rank ||
          (rank == best_rank && (match > best_match || (match == best_match && room > best_room)))) {
        best = &m;
        best_rank = rank;
        best_match = match;
        best_room = room;
      }
    }
    if (best == nullptr) {
      if (candidate.kv_slots_needed <= largest) return;  // it fits once running requests finish: wait
      end_waiting(*pick, absl::ResourceExhaustedError(absl::StrCat("the request needs ", candidate.kv_slots_needed,
                                                                   " KV slots; the largest live KV pool has ",
                                                                   largest)));
      continue;
    }
    MakeRoom(best->spec.name, best->kv_capacity_slots, need_now);
    auto request = std::make_shared<RequestState>();
    request->handle = queue_[*pick];
    request->spec = std::move(queued_specs_[candidate.id]);
    request->memory_node = best->spec.name;
    request->admitted = ++admissions_;
    request->running_samples = request->spec.n;
    Sequence seq;
    seq.request = request;
    seq.seq_id = next_seq_id_++;
    for (int32_t k = 1; k < request->spec.n; ++k) seq.forks.push_back(next_seq_id_++);
    seq.text = std::make_unique<TextStream>(tokenizer_, request->spec.stop_strings);
    if (topology_.prefix_caching) {
      // Start from a cached prefix: share its slots and compute only the rest of the prompt.
      auto hit = prefix_cache_.Longest(request->memory_node, request->spec.prompt);
      if (hit && memory_.Fork(request->memory_node, hit->cache_seq, seq.seq_id, hit->length).ok()) {
        seq.start_position = static_cast<int32_t>(hit->length);
      }
    }
    metrics_.Admitted(absl::Now() - request->handle->submitted(), static_cast<int64_t>(request->spec.prompt.size()),
                      seq.start_position);
    queued_specs_.erase(candidate.id);
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(*pick));
    admitted_tokens += candidate.prompt_tokens;
    use[request->memory_node] += Footprint(seq);
    if (auto rows = row_room.find(request->memory_node); rows != row_room.end()) rows->second -= request->spec.n;
    if (best->spec.kind == NodeKind::kCompute && batch_->pace.local_step_seconds() == 0) {
      for (auto& [node, rows] : row_room) rows = 0;  // as BalancedRowRoom: local steps are timed first
    }
    batch_->running.push_back(std::move(seq));
  }
}

std::map<std::string, int64_t> Scheduler::BalancedRowRoom(const std::vector<MemberInfo>& members) const {
  std::map<std::string, int64_t> room;
  if (topology_.placement != "balanced") return room;
  // The batch's (first) compute node: its pool takes what memory nodes cannot; without one,
  // memory nodes hold every row and nothing is capped.
  const MemberInfo* compute = nullptr;
  for (const MemberInfo& m : members) {
    if (m.spec.name == batch_->compute_nodes.front()) compute = &m;
  }
  if (compute == nullptr || !compute->spec.holds_kv()) return room;
  for (const MemberInfo& m : members) {
    if (m.spec.kind != NodeKind::kMemory) continue;
    if (!batch_->pace.OffloadingPays()) {
      room[m.spec.name] = 0;
      continue;
    }
    int64_t rows = 0, local_rows = 0;
    for (const Sequence& seq : batch_->running) {
      const int64_t samples = 1 + static_cast<int64_t>(seq.forks.size());
      if (seq.request->memory_node == m.spec.name) rows += samples;
      if (seq.request->memory_node == compute->spec.name) local_rows += samples;
    }
    if (batch_->pace.local_step_seconds() == 0 && local_rows > 0) {
      room[m.spec.name] = 0;  // the pool's own steps are timed first: they are what offloading must beat
      continue;
    }
    const int64_t cap =
        BalancedRowCap(batch_->pace.local_step_seconds(), config_.num_layers, m.row_attention_seconds);
    room[m.spec.name] = cap - rows;
  }
  return room;
}

void Scheduler::RecordDecodePace(const lamina::v1::StepPlan& plan, double seconds) {
  if (topology_.placement != "balanced") return;
  int64_t local = 0, remote = 0;
  for (const auto& item : plan.decode()) ++(batch_->Uses(item.memory_node()) ? local : remote);
  batch_->pace.Record(local, remote, seconds);
}

bool Scheduler::MayHold(const MemberInfo& m) const {
  if (!m.alive() || !m.spec.holds_kv()) return false;
  return m.spec.kind == NodeKind::kMemory || batch_->Uses(m.spec.name);
}

int Scheduler::PlacementRank(const MemberInfo& m, int64_t room, int64_t whole_need) const {
  const bool local = m.spec.kind == NodeKind::kCompute;
  // A local pool that cannot hold the request to its end comes last: it would be preempted there
  // as it grows, where a memory node may hold it whole.
  if (local && room < whole_need) return 2;
  return local == (topology_.placement != "offload_first") ? 0 : 1;  // balanced fills the local pool first too
}

int64_t Scheduler::PrefillLength(const Sequence& seq) {
  return static_cast<int64_t>(seq.request->spec.prompt.size() + (seq.resume ? seq.output.size() : 0));
}

int64_t Scheduler::Footprint(const Sequence& seq) const {
  const int64_t prompt = static_cast<int64_t>(seq.request->spec.prompt.size());
  if (seq.prefilled) return seq.next_position + 1;
  if (seq.resume) return prompt + static_cast<int64_t>(seq.output.size());
  return prompt + static_cast<int64_t>(seq.forks.size());
}

int64_t Scheduler::NodeUse(const std::string& node) const {
  int64_t use = 0;
  for (const std::unique_ptr<Batch>& batch : batches_) {
    for (const Sequence& seq : batch->running) {
      if (seq.request->memory_node == node) use += Footprint(seq);
    }
  }
  return use;
}

bool Scheduler::OtherBatchesUse(const std::string& node) const {
  for (const std::unique_ptr<Batch>& batch : batches_) {
    if (batch.get() == batch_) continue;
    for (const Sequence& seq : batch->running) {
      if (seq.request->memory_node == node) return true;
    }
  }
  return false;
}

void Scheduler::PreemptWhereFull() {
  for (const MemberInfo& m : membership_->Snapshot()) {
    if (!MayHold(m)) continue;
    const std::string& node = m.spec.name;
    while (NodeUse(node) + prefix_cache_.CachedSlots(node) > m.kv_capacity_slots) {
      if (std::optional<SequenceId> victim = prefix_cache_.EvictOldest(node)) {
        memory_.Free(node, {*victim}).IgnoreError();
        continue;
      }
      std::shared_ptr<RequestState> youngest;
      std::set<const RequestState*> requests_here;
      for (const Sequence& seq : batch_->running) {
        if (seq.request->memory_node != node) continue;
        requests_here.insert(seq.request.get());
        if (!youngest || seq.request->admitted > youngest->admitted) youngest = seq.request;
      }
      // The last request on a node always fits alone: its final size was checked when it
      // arrived. While another batch holds the node too, this batch gives way entirely (the
      // other's step is in flight and cannot be touched); it resumes once there is room.
      if (!youngest || (requests_here.size() < 2 && !OtherBatchesUse(node))) break;
      Preempt(youngest);
    }
  }
}

void Scheduler::WithdrawUnpaidOffload() {
  if (topology_.placement != "balanced" || batch_->pace.OffloadingPays()) return;
  std::vector<std::shared_ptr<RequestState>> offloaded;
  for (const Sequence& seq : batch_->running) {
    const bool remote = !batch_->Uses(seq.request->memory_node);
    if (remote && std::find(offloaded.begin(), offloaded.end(), seq.request) == offloaded.end()) {
      offloaded.push_back(seq.request);
    }
  }
  // Only where the compute node has a pool of its own to take them back.
  if (offloaded.empty() || BalancedRowRoom(membership_->Snapshot()).empty()) return;
  for (const std::shared_ptr<RequestState>& request : offloaded) Preempt(request);
}

void Scheduler::Preempt(const std::shared_ptr<RequestState>& request) {
  std::vector<Sequence> samples, keep;
  std::vector<int64_t> ids;
  for (Sequence& seq : batch_->running) {
    if (seq.request != request) {
      keep.push_back(std::move(seq));
      continue;
    }
    ids.push_back(seq.seq_id);
    seq.prefilled = false;
    seq.resume = !seq.output.empty();
    seq.start_position = 0;
    samples.push_back(std::move(seq));
  }
  batch_->running = std::move(keep);
  memory_.Free(request->memory_node, ids).IgnoreError();
  batch_->preempted.push_back(std::move(samples));
  std::lock_guard<std::mutex> lock(mu_);
  ++preemptions_;
}

bool Scheduler::ResumePreempted(std::map<std::string, int64_t>* row_room) {
  while (!batch_->preempted.empty() && static_cast<int>(batch_->running.size()) < topology_.max_batch) {
    std::vector<Sequence>& samples = batch_->preempted.front();
    if (samples[0].request->handle->cancelled()) {
      for (Sequence& seq : samples) Finish(seq, FinishReason::kNone, absl::CancelledError("cancelled by the client"));
      batch_->preempted.pop_front();
      continue;
    }
    int64_t need = 0;
    for (const Sequence& seq : samples) need += Footprint(seq) + 1;
    std::optional<MemberInfo> best;
    int64_t best_room = -1, largest = 0;
    int best_rank = 0;
    for (const MemberInfo& m : membership_->Snapshot()) {
      if (!MayHold(m)) continue;
      largest = std::max(largest, m.kv_capacity_slots);
      const int64_t room = m.kv_capacity_slots - NodeUse(m.spec.name);  // cached prefixes give way
      const int rank = PlacementRank(m, room, SlotsNeeded(samples[0].request->spec));
      if (auto rows = row_room->find(m.spec.name);
          rows != row_room->end() && rows->second < static_cast<int64_t>(samples.size())) {
        continue;  // balanced: as for admission
      }
      if (room >= need && (!best || rank < best_rank || (rank == best_rank && room > best_room))) {
        best = m;
        best_rank = rank;
        best_room = room;
      }
    }
    if (!best && largest < need) {
      // No live pool could ever hold it (its pool died and the others are smaller, or none is
      // left): it ends now rather than waiting on nothing.
      const absl::Status error = absl::UnavailableError(absl::StrCat(
          "no live KV pool can hold this request's ", need, " slots (the largest live one has ", largest, ")"));
      for (Sequence& seq : samples) Finish(seq, FinishReason::kNone, error, {}, /*slots_freed=*/true);
      batch_->preempted.pop_front();
      continue;
    }
    if (!best) return false;  // wait for running requests to finish
    MakeRoom(best->spec.name, best->kv_capacity_slots, need);
    samples[0].request->memory_node = best->spec.name;
    if (auto rows = row_room->find(best->spec.name); rows != row_room->end()) {
      rows->second -= static_cast<int64_t>(samples.size());
    }
    for (Sequence& seq : samples) batch_->running.push_back(std::move(seq));
    batch_->preempted.pop_front();
  }
  return batch_->preempted.empty();
}

void Scheduler::MakeRoom(const std::string& node, int64_t capacity, int64_t need) {
  while (capacity - NodeUse(node) - prefix_cache_.CachedSlots(node) < need) {
    std::optional<SequenceId> victim = prefix_cache_.EvictOldest(node);
    if (!victim) return;
    memory_.Free(node, {*victim}).IgnoreError();  // slots still shared by requests stay theirs
  }
}

void Scheduler::CachePrompt(const Sequence& seq) {
  if (!topology_.prefix_caching) return;
  const std::vector<int32_t>& prompt = seq.request->spec.prompt;
  const int64_t length = prefix_cache_.CacheableLength(prompt);
  if (length == 0) return;
  absl::Span<const int32_t> prefix(prompt.data(), static_cast<size_t>(length));
  const std::string& node = seq.request->memory_node;
  if (prefix_cache_.Contains(node, prefix)) return;
  const SequenceId cache_seq = next_seq_id_++;
  if (memory_.Fork(node, seq.seq_id, cache_seq, length).ok()) prefix_cache_.Insert(node, cache_seq, prefix);
}

}  // namespace lamina
