// The coordinator's batching loop: continuous batching with one or more batches in flight.
//
// Requests are validated when submitted: INVALID_ARGUMENT for a bad one, RESOURCE_EXHAUSTED for
// one that needs more KV slots than any memory node has, UNAVAILABLE when the cluster is not up.
// Accepted requests wait in a queue.
//
// Batches (staggered pipelining, the paper's section 5.1): the topology's `pipelining` sets how
// many batches are in flight and where each runs: `none`, one batch on the one compute node;
// `fixed`, one batch per compute node; `rotational`, two batches alternating on one compute node
// (each on its own Step stream, which the node serves with its own engine, so one batch's slices
// run while the other's attention runs on the memory nodes); `auto` on one compute node, the
// second batch takes new requests only while more than `rotational_above` sequences are running
// or waiting, so small loads keep one batch's latency; `rotational` over R > 1 compute nodes, R + 1
// batches each sent to every compute node, where slice k of batch j runs on node (j + k) mod R
// (the node running the last slice returns the tokens; a batch ends when any of its nodes fails). One thread drives
// every batch in turn: it collects a batch's result, prepares its next plan and sends it, then moves on to the next
// batch while this one runs. A request stays in the batch that admitted it.
//
// Preparing a batch's plan
//   1. ends sequences whose memory node died (UNAVAILABLE) or whose client cancelled (freeing
//      their slots at once),
//   2. resumes the batch's preempted requests, then admits queued ones in the order its
//      AdmissionPolicy picks (FIFO by default) while the batch limit, the batch's equal share of
//      the sequences running or waiting, the per-iteration token budget (with chunked prefill,
//      while any of it is left) and a pool's free slots (counting every batch's sequences) allow.
//      A pool is a memory node's, or the batch's own compute node's (local attention); the
//      topology's placement ranks them (PlacementRank), then the one holding the longest cached
//      prefix of the prompt, then the one with the most room, wins; a request that could never
//      fit was refused when submitted,
//   3. when a memory node would run dry in the step, evicts cached prefixes there and then
//      preempts the batch's youngest request there (slots freed now, tokens kept, recomputed
//      later: the output is the same), down to its last one, or to none while another batch
//      holds the node too (that batch's step is in flight and cannot be touched),
//   4. sends one plan to the batch's compute node: decode for the running sequences, prefill for
//      new ones. With chunked prefill the prompts share what the token budget leaves after the
//      decodes, in admission order (PrefillBudget: the first one at least 16 tokens, so that it
//      always moves): a prompt that does not fit goes as a partial item, and later steps send
//      the rest, chunk by chunk, until its last chunk draws its first token.
// Collecting a result streams each sampled token to its request and retires the finished ones.
// A step that fails because memory nodes are unreachable marks them dead and runs again without
// their sequences; one that fails at the compute node ends the batch with UNAVAILABLE. When a
// compute node of the batch has died (or, under rotation, one replica's stream broke), that comes
// first: the others' failures, and the memory nodes they report unreachable, follow from it.
// What a memory node declared dead held (its requests' slots, cached prefixes) is freed there if
// it registers again: a node that hung rather than died comes back with nothing of it allocated.
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

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/attention/attention_service.h"
#include "common/model_config/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "common/topology/topology.h"
#include "coordinator/cluster/membership.h"
#include "coordinator/scheduler/admission_policy.h"
#include "coordinator/scheduler/balanced_placement.h"
#include "coordinator/scheduler/node_clients.h"
#include "coordinator/scheduler/prefix_cache.h"
#include "coordinator/scheduler/request.h"
#include "coordinator/scheduler/serving_metrics.h"
#include "coordinator/scheduler/step_stagger.h"
#include "coordinator/sequence/text_stream.h"

namespace lamina {

struct SchedulerStats {
  int64_t queued = 0;
  int64_t running = 0;
  int64_t completed = 0;
  int64_t failed = 0;     // ended by an error (not the client's cancelling)
  int64_t cancelled = 0;  // ended by their client
  int64_t preemptions = 0;
  double tokens_per_second = 0;
  // Iterations that succeeded, the sequences they decoded, the prompt tokens they prefilled, and
  // the wall time of all iterations (successful or not) from plan sent to result read.
  int64_t iterations = 0;
  int64_t decoded_sequences = 0;
  int64_t prefilled_tokens = 0;
  double iteration_seconds = 0;
  std::vector<int64_t> running_per_batch;  // sequences in each batch in flight
  // Per pool: what the prefix cache holds there (sequences and slots kept for later prompts, part
  // of what the pool reports in use).
  std::map<std::string, PrefixCache::Use> cached;
};

class Scheduler {
 public:
  // `policy` picks which waiting request to admit next; null means FIFO. Calls to the nodes carry
  // `secret`'s token when there is one.
  Scheduler(const Topology& topology, const ModelConfig& config, const Tokenizer* tokenizer, Membership* membership,
            std::unique_ptr<AdmissionPolicy> policy = nullptr, const std::optional<ClusterSecret>& secret = std::nullopt);
  ~Scheduler();  // stops the loop; unfinished requests end with UNAVAILABLE

  absl::StatusOr<std::shared_ptr<RequestHandle>> Submit(GenerationSpec spec);
  // A request the API refused before it reached Submit (its bounds, its chat), counted as
  // Submit's refusals are.
  void CountRefused(absl::StatusCode code) { metrics_.Refused(code); }
  // Shutting down gently: admits nothing more (Submit answers UNAVAILABLE, and queued requests end
  // so), and waits until the requests in flight have ended or `grace` has passed; whether they all
  // ended. Those still running end with UNAVAILABLE when the scheduler is destroyed.
  bool Drain(absl::Duration grace);
  // Called when a node is declared dead: wakes the loop, and aborts the pending steps of the
  // batches on it when it is a compute node.
  void OnNodeDeath(const std::string& node);
  SchedulerStats Stats() const;
  // Latencies, token counts and outcomes of the requests so far.
  const ServingMetrics& metrics() const { return metrics_; }
  // The topology's pipelining mode.
  const std::string& pipelining() const { return topology_.pipelining; }

 private:
  // What a request's samples share.
  struct RequestState {
    std::shared_ptr<RequestHandle> handle;
    GenerationSpec spec;
    std::string memory_node;
    uint64_t admitted = 0;  // admission order: the youngest request is preempted first
    int32_t running_samples = 0;
    bool failed = false;  // an error event was sent; the request is over for the client
    absl::StatusCode error = absl::StatusCode::kOk;  // the error sent, when failed
    bool first_token = false;                        // a sample has produced a token
    int64_t generated = 0;                           // tokens of the samples finished so far
    int32_t migrations = 0;  // times moved off a failed node and recomputed elsewhere
  };
  // One sample of a request: a sequence on the compute and memory nodes.
  struct Sequence {
    std::shared_ptr<RequestState> request;
    SequenceId seq_id = 0;
    int32_t index = 0;
    std::vector<SequenceId> forks;  // sample 0 before its prefill: the ids of samples 1 .. n-1
    // Before its prefill: prompt positions already on the memory node (shared from the prefix
    // cache, or prefilled by earlier chunks).
    int32_t start_position = 0;
    int32_t chunk = 0;  // before its prefill: the tokens the plan in flight computes (0: none)
    bool prefilled = false;
    bool resume = false;            // preempted: its next prefill recomputes prompt + output
    std::vector<int32_t> output;    // every token sampled so far
    int32_t last_token = 0;
    int32_t next_position = 0;  // where last_token is fed back
    int32_t generated = 0;
    absl::Time last_token_at = absl::InfinitePast();  // when its last token was streamed
    std::unique_ptr<TextStream> text;
  };

  // One batch in flight: its compute node and stream (under rotation over several compute nodes,
  // one per replica, the plan going to each), its sequences and its step.
  struct Batch {
    Batch(int index, const std::vector<const NodeSpec*>& nodes, const std::optional<ClusterSecret>& secret);
    // A dead node among the batch's compute nodes (its name), or "" when all are alive.
    std::string DeadComputeNode(const Membership& membership) const;
    bool Uses(const std::string& compute_node) const;
    void Abort();  // the pending Receive of every replica returns Unavailable

    int index;
    std::vector<std::string> compute_nodes;
    std::vector<std::unique_ptr<ComputeClient>> computes;
    int rotation_replicas = 0;  // plan.rotation_replicas
    std::vector<Sequence> running;
    std::deque<std::vector<Sequence>> preempted;  // preempted requests' samples, oldest first
    std::vector<int64_t> release;                 // sequences the compute node may forget
    uint64_t step_id = 0;
    bool in_flight = false;
    lamina::v1::StepPlan plan;  // the plan in flight
    absl::Time step_start;
    DecodePace pace;  // for balanced placement
    // When the step in flight started (0: none), for the watchdog that aborts a step past the
    // topology's step_timeout_ms.
    std::atomic<int64_t> step_started_ms{0};
  };

  // Submit's checks and queueing.
  absl::StatusOr<std::shared_ptr<RequestHandle>> Enqueue(GenerationSpec spec);
  void Loop();
  // Unavailable naming the current batch's first compute node that is not alive; OK when all are.
  absl::Status DeadComputeNodeError() const;
  // Another batch whose compute nodes are all alive, the one running fewest sequences; null when
  // there is none (or batches rotate over every compute node).
  Batch* LiveBatch() const;
  // Sends the current batch's next plan, if it has work.
  void Prepare();
  // Waits for the current batch's step and applies its result.
  void Collect();
  // The current batch's step result, from its one compute node or merged from its replicas'
  // (MergeReplicaResults).
  // `broken`: the compute nodes whose stream broke (not answered: gone or unreachable).
  absl::StatusOr<lamina::v1::StepResult> ReceiveResult(std::vector<std::string>* broken);
  void Watchdog();
  void EndDeadAndCancelled();
  // Moves `sequences` (their nodes failed: a KV pool, or the compute node running their batch)
  // into batch `to`'s preempted queue, to be recomputed on a surviving pool as preemption
  // recomputes (prompt and output so far, the same draws), their slots freed where they were. A
  // request moved scheduler.max_migrations times already ends with UNAVAILABLE instead.
  void Migrate(std::vector<Sequence> sequences, Batch* to, const std::string& why);
  // Admission and placement (scheduler_admission.cc).
  void Admit();
  // The KV slots a request needs at most: its prompt once, plus every sample's generated tokens
  // (bounded by the context).
  int64_t SlotsNeeded(const GenerationSpec& spec) const;
  // Also sets each unprefilled sequence's `chunk`.
  lamina::v1::StepPlan BuildPlan();
  // The tokens a sequence's prefill computes in all: its prompt, and for a resumed one also its output.
  static int64_t PrefillLength(const Sequence& seq);
  void ApplyResult(const lamina::v1::StepResult& result);
  // Records a sampled token; false when the sample finished (and was retired).
  bool Advance(Sequence& seq, const lamina::v1::SampledToken& sampled);
  // After sample 0's prefill: fork its prompt into samples 1 .. n-1 on the memory node.
  std::vector<Sequence> ForkSamples(Sequence& first);
  // After a prefill: keep the prompt's whole blocks on its memory node for later prompts.
  void CachePrompt(const Sequence& seq);
  // Under `balanced` placement, how many more of the current batch's rows each memory node may
  // take (BalancedRowCap less the rows it holds; none while the pool's own steps are untimed and
  // it holds rows, nor once the batch's DecodePace says offloading does not pay); empty otherwise,
  // or when the batch's compute node has no pool of its own.
  std::map<std::string, int64_t> BalancedRowRoom(const std::vector<MemberInfo>& members) const;
  // Under `balanced` placement, feeds the current batch's DecodePace with a decode step's time.
  void RecordDecodePace(const lamina::v1::StepPlan& plan, double seconds);
  // Whether a sequence of the current batch may live on `m`: a live memory node, or the batch's own
  // compute node when it has a pool of its own.
  bool MayHold(const MemberInfo& m) const;
  // Where the topology's placement puts `m`, with `room` slots left, among the nodes that may hold
  // a request of `whole_need` slots at its end: 0 first.
  int PlacementRank(const MemberInfo& m, int64_t room, int64_t whole_need) const;
  // Evicts cached prefixes on `node`, least recently used first, until `need` more slots fit.
  void MakeRoom(const std::string& node, int64_t capacity, int64_t need);
  // Slots a sequence holds once the next step has run. Shared slots count for every holder, so
  // the sums below can only overestimate: a memory node is never overcommitted. NodeUse counts
  // the sequences of every batch.
  int64_t Footprint(const Sequence& seq) const;
  int64_t NodeUse(const std::string& node) const;
  // When a memory node would run dry in the next step: evict cached prefixes, then preempt the
  // youngest request there (its slots freed, its tokens kept, resumed later by recomputing).
  void PreemptWhereFull();
  // Under `balanced` placement, once the batch's DecodePace says offloading does not pay: preempts
  // the batch's requests on memory nodes, to resume in the compute node's own pool.
  void WithdrawUnpaidOffload();
  // Preempts one of the current batch's requests: its slots freed, its tokens kept, resumed later
  // by recomputing.
  void Preempt(const std::shared_ptr<RequestState>& request);
  // Whether a batch other than the current one has sequences on `node`.
  bool OtherBatchesUse(const std::string& node) const;
  // Resumes preempted requests (before any new one), within `row_room` (BalancedRowRoom, reduced
  // by what they take); false while the oldest cannot fit yet.
  bool ResumePreempted(std::map<std::string, int64_t>* row_room);
  // Ends a sequence: the final event, its slots freed on its memory node (unless the caller
  // freed them: `slots_freed`), its sampler released.
  void Finish(Sequence& seq, FinishReason reason, const absl::Status& error, RequestEvent last = {},
              bool slots_freed = false);
  // Frees sequences' slots on a live memory node and records its use; a node that does not answer
  // within a second is logged and left to its own accounting. A node declared dead keeps them
  // until it registers again (FreeOrphans): a hung node comes back with its pool as it was.
  void FreeSlots(const std::string& node, const std::vector<int64_t>& seq_ids);
  // Frees on each memory node alive again what it held when it was declared dead.
  void FreeOrphans();
  // Ends the current batch's running requests, freeing their slots with one call per memory node.
  void FailAll(const absl::Status& error);
  void FailPreempted(const absl::Status& error);
  // Ends every request of every batch, running and preempted, and the queued ones.
  void FailEverything(const absl::Status& error);
  void RecordTokens(int64_t count);
  // Ends a queued request with `error` (mu_ held): its last event and its counts. The caller takes
  // it off the queue.
  void EndQueued(RequestHandle& handle, const absl::Status& error);

  const Topology topology_;
  const ModelConfig config_;
  const Tokenizer* tokenizer_;
  Membership* membership_;
  MemoryClients memory_;
  std::unique_ptr<AdmissionPolicy> policy_;  // used on the loop thread, under mu_

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<RequestHandle>> queue_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, GenerationSpec> queued_specs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;  // Drain
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // sequences running or preempted after the last pass
  uint64_t passes_ ABSL_GUARDED_BY(mu_) = 0;    // passes of the loop so far
  int64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t preemptions_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, PrefixCache::Use> cached_ ABSL_GUARDED_BY(mu_);
  int64_t iterations_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t decoded_sequences_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prefilled_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> running_per_batch_ ABSL_GUARDED_BY(mu_);  // sequences in each batch
  double iteration_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::pair<absl::Time, int64_t>> recent_tokens_ ABSL_GUARDED_BY(mu_);

  // Owned by the loop thread, except that the watchdog reads each batch's step_started_ms and
  // any thread may Abort() a batch's stream. `batch_` is the batch the loop is working on: the
  // per-batch steps above (admission, preemption, plans, results, failures) act on it.
  std::vector<std::unique_ptr<Batch>> batches_;
  Batch* batch_ = nullptr;
  // With the topology's scheduler.stagger, when each batch may send its next step.
  std::unique_ptr<StepStagger> stagger_;
  uint64_t admissions_ = 0;
  std::thread watchdog_;
  SequenceId next_seq_id_ = 1;
  PrefixCache prefix_cache_;
  // Per memory node declared dead, the sequences (requests' and cached prefixes') it held then.
  std::map<std::string, std::vector<int64_t>> orphaned_;
  ServingMetrics metrics_;
  std::thread loop_;
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SCHEDULER_SCHEDULER_H_
