// The coordinator's batching loop (continuous batching, one batch in flight).
//
// Requests are validated when submitted: INVALID_ARGUMENT for a bad one, RESOURCE_EXHAUSTED for
// one that needs more KV slots than any memory node has, UNAVAILABLE when the cluster is not up.
// Accepted requests wait in a queue; every iteration the loop
//   1. ends sequences whose memory node died (UNAVAILABLE) or whose client cancelled (freeing
//      their slots at once),
//   2. resumes preempted requests, then admits queued ones in the order its AdmissionPolicy picks
//      (FIFO by default) while the batch, the per-iteration token budget and a memory node's free
//      slots allow (the node holding the longest cached prefix of the prompt, else the one with
//      the most room); a request that could never fit was refused when submitted,
//   3. when a memory node would run dry in the step, evicts cached prefixes there and then
//      preempts its youngest request (slots freed now, tokens kept, recomputed later: the output
//      is the same),
//   4. sends one plan to the compute node: prefill for new sequences, decode for the others,
//   5. streams each sampled token to its request and retires the finished ones.
// A step that fails because memory nodes are unreachable marks them dead and runs again without
// their sequences; one that fails at the compute node ends the batch with UNAVAILABLE.
// Thread-safe: Submit and the stats may be called from any thread.
#ifndef LAMINA_COORDINATOR_SCHEDULER_SCHEDULER_H_
#define LAMINA_COORDINATOR_SCHEDULER_SCHEDULER_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/attention/attention_service.h"
#include "common/model_config/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "common/topology/topology.h"
#include "coordinator/cluster/membership.h"
#include "coordinator/scheduler/admission_policy.h"
#include "coordinator/scheduler/node_clients.h"
#include "coordinator/scheduler/prefix_cache.h"
#include "coordinator/scheduler/request.h"
#include "coordinator/sequence/text_stream.h"

namespace lamina {

struct SchedulerStats {
  int64_t queued = 0;
  int64_t running = 0;
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t preemptions = 0;
  double tokens_per_second = 0;
  // Iterations that succeeded, the sequences they decoded, the prompt tokens they prefilled, and
  // the wall time of all iterations (successful or not) from plan sent to result read.
  int64_t iterations = 0;
  int64_t decoded_sequences = 0;
  int64_t prefilled_tokens = 0;
  double iteration_seconds = 0;
};

class Scheduler {
 public:
  // `policy` picks which waiting request to admit next; null means FIFO.
  Scheduler(const Topology& topology, const ModelConfig& config, const Tokenizer* tokenizer, Membership* membership,
            std::unique_ptr<AdmissionPolicy> policy = nullptr);
  ~Scheduler();  // stops the loop; unfinished requests end with UNAVAILABLE

  absl::StatusOr<std::shared_ptr<RequestHandle>> Submit(GenerationSpec spec);
  // Called when a node is declared dead: wakes the loop, and aborts a pending step when it is
  // the compute node.
  void OnNodeDeath(const std::string& node);
  SchedulerStats Stats() const;

 private:
  // What a request's samples share.
  struct RequestState {
    std::shared_ptr<RequestHandle> handle;
    GenerationSpec spec;
    std::string memory_node;
    uint64_t admitted = 0;  // admission order: the youngest request is preempted first
    int32_t running_samples = 0;
    bool failed = false;  // an error event was sent; the request is over for the client
  };
  // One sample of a request: a sequence on the compute and memory nodes.
  struct Sequence {
    std::shared_ptr<RequestState> request;
    SequenceId seq_id = 0;
    int32_t index = 0;
    std::vector<SequenceId> forks;  // sample 0 before its prefill: the ids of samples 1 .. n-1
    int32_t start_position = 0;     // before its prefill: prompt positions already shared from the prefix cache
    bool prefilled = false;
    bool resume = false;            // preempted: its next prefill recomputes prompt + output
    std::vector<int32_t> output;    // every token sampled so far
    int32_t last_token = 0;
    int32_t next_position = 0;  // where last_token is fed back
    int32_t generated = 0;
    std::unique_ptr<TextStream> text;
  };

  void Loop();
  void Watchdog();
  void EndDeadAndCancelled();
  void Admit();
  lamina::v1::StepPlan BuildPlan();
  void ApplyResult(const lamina::v1::StepResult& result);
  // Records a sampled token; false when the sample finished (and was retired).
  bool Advance(Sequence& seq, int32_t token);
  // After sample 0's prefill: fork its prompt into samples 1 .. n-1 on the memory node.
  std::vector<Sequence> ForkSamples(Sequence& first);
  // After a prefill: keep the prompt's whole blocks on its memory node for later prompts.
  void CachePrompt(const Sequence& seq);
  // Evicts cached prefixes on `node`, least recently used first, until `need` more slots fit.
  void MakeRoom(const std::string& node, int64_t capacity, int64_t need);
  // Slots a sequence holds once the next step has run. Shared slots count for every holder, so
  // the sums below can only overestimate: a memory node is never overcommitted.
  int64_t Footprint(const Sequence& seq) const;
  int64_t NodeUse(const std::string& node) const;
  // When a memory node would run dry in the next step: evict cached prefixes, then preempt the
  // youngest request there (its slots freed, its tokens kept, resumed later by recomputing).
  void PreemptWhereFull();
  // Resumes preempted requests (before any new one); false while the oldest cannot fit yet.
  bool ResumePreempted();
  // Ends a sequence: the final event, its slots freed on its memory node, its sampler released.
  void Finish(Sequence& seq, FinishReason reason, const absl::Status& error, RequestEvent last = {});
  void FailAll(const absl::Status& error);
  void FailPreempted(const absl::Status& error);
  // Ends every request: running, preempted and queued.
  void FailEverything(const absl::Status& error);
  void RecordTokens(int64_t count);

  const Topology topology_;
  const ModelConfig config_;
  const Tokenizer* tokenizer_;
  Membership* membership_;
  std::string compute_node_;
  ComputeClient compute_;
  MemoryClients memory_;
  std::unique_ptr<AdmissionPolicy> policy_;  // used on the loop thread, under mu_

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<RequestHandle>> queue_;      // guarded by mu_
  std::map<uint64_t, GenerationSpec> queued_specs_;       // guarded by mu_
  uint64_t next_id_ = 1;                                  // guarded by mu_
  bool stopping_ = false;                                 // guarded by mu_
  int64_t running_count_ = 0, completed_ = 0, failed_ = 0, preemptions_ = 0;  // guarded by mu_
  int64_t iterations_ = 0, decoded_sequences_ = 0, prefilled_tokens_ = 0;    // guarded by mu_
  double iteration_seconds_ = 0;                                             // guarded by mu_
  std::deque<std::pair<absl::Time, int64_t>> recent_tokens_;  // guarded by mu_

  // Owned by the loop thread.
  std::vector<Sequence> running_;
  std::deque<std::vector<Sequence>> preempted_;  // preempted requests' samples, oldest first
  uint64_t admissions_ = 0;
  std::vector<int64_t> release_;             // sequences the compute node may forget
  uint64_t step_id_ = 0;
  // When the step in flight started (0: none), for the watchdog that aborts a step past the
  // topology's step_timeout_ms.
  std::atomic<int64_t> step_started_ms_{0};
  std::thread watchdog_;
  SequenceId next_seq_id_ = 1;
  PrefixCache prefix_cache_;
  std::thread loop_;
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SCHEDULER_SCHEDULER_H_
