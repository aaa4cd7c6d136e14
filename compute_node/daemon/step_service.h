// lamina.v1.ComputeNode: runs the coordinator's iteration plans. For each plan: prefill the new
// sequences, decode the running ones (both through a ComputeEngine, whose attention runs on the
// node's own pool or on memory nodes as each sequence was placed: PlacedAttention), drawing one
// token per sequence with its own sampling parameters (on the GPU when the engine runs there).
// A failed step samples nothing and names the memory nodes that could not be reached, so the
// coordinator can drop their sequences and send the plan again without them.
// Runners: the node keeps one engine and one set of data-plane connections per batch the topology
// runs on it (two under rotational pipelining). Each Step stream holds a runner while it is open,
// so two batches' plans run at once: one batch's slices compute while the other's attention runs
// on the memory nodes. A stream beyond the runners waits for one to free up.
// Rotational pipelining over several compute nodes: a plan that names a batch (rotation_batch)
// runs with that batch's SliceRelay, so the runner's engine runs only the slices this node owns,
// and only the node running the last slice returns tokens.
// Thread-safe.
#ifndef LAMINA_COMPUTE_NODE_DAEMON_STEP_SERVICE_H_
#define LAMINA_COMPUTE_NODE_DAEMON_STEP_SERVICE_H_

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/metrics/busy_meter.h"
#include "common/metrics/interval_union.h"
#include "common/security/cluster_secret.h"
#include "compute_node/engine/compute_engine.h"
#include "compute_node/local/placed_attention.h"
#include "compute_node/rotation/slice_relay.h"
#include "compute_node/sampling/penalties.h"
#include "compute_node/sampling/sampler.h"
#include "compute_node/tensor_parallel/rank_group.h"
#include "lamina/v1/node.grpc.pb.h"

namespace lamina {

// One engine and its attention (local pool, data-plane connections), and a tensor-parallel
// rank's group (null otherwise), whose collectives each plan brackets; owned by the caller.
struct BatchRunner {
  ComputeEngine* engine;
  PlacedAttention* attention;
  RankGroup* rank_group = nullptr;
};

class StepService final : public lamina::v1::ComputeNode::Service {
 public:
  // `relays[j]`: batch j's route through this node under rotational pipelining over several
  // compute nodes (empty otherwise); owned by the caller. `device_busy`: GPU engines time their
  // busy time on the device (ComputeEngine::set_device_busy).
  // Plans must carry `secret`'s token, when there is one.
  explicit StepService(std::vector<BatchRunner> runners, std::vector<SliceRelay*> relays = {},
                       bool device_busy = false, std::optional<ClusterSecret> secret = std::nullopt);

  grpc::Status Step(grpc::ServerContext* context,
                    grpc::ServerReaderWriter<lamina::v1::StepResult, lamina::v1::StepPlan>* stream) override;

  // Runs one plan on a runner the caller holds (exposed for tests, which hold runner 0).
  lamina::v1::StepResult RunPlan(const lamina::v1::StepPlan& plan, int runner = 0);
  // Frees every sequence of a plan whose result the coordinator will never read.
  void Abandon(const lamina::v1::StepPlan& plan, int runner);
  // Drops every sequence's sampling state (a new coordinator knows none of them).
  void ForgetSequences();
  // Plans run (count) and time spent running them, summed over runners.
  const BusyMeter& busy() const { return busy_; }
  // Seconds computing, what is left idle showing the pipeline's bubbles: while at least one runner
  // runs a plan and is not waiting on a memory node or another compute node (on a GPU whose work
  // is queued ahead, the GPU's waits then count as computing). With `device_busy` on a GPU: the
  // runners' slices as the device timed them, exchanges with other nodes (sends, flag waits) left
  // out, each instant counted once.
  double ComputingSeconds() const;
  // Per-layer attention round trips, summed over runners.
  BusyMeter::Snapshot RoundTrips() const;

 private:
  struct Runner {
    BatchRunner parts;
    bool held = false;  // guarded by StepService::runners_mu_
  };
  // Blocks until a runner is free, then holds it; nullopt if the stream was cancelled meanwhile.
  std::optional<int> HoldRunner(grpc::ServerContext* context);
  void ReleaseRunner(int runner);

  // The relay of a rotating plan's batch; null for a plan that does not rotate. InvalidArgument
  // when the plan's rotation does not match the topology this node was started with.
  absl::StatusOr<SliceRelay*> RelayFor(const lamina::v1::StepPlan& plan) const;

  std::vector<Runner> runners_;
  const std::vector<SliceRelay*> relays_;
  const std::optional<ClusterSecret> secret_;
  std::mutex runners_mu_;
  std::condition_variable runner_freed_;
  // Each sequence's sampling parameters, from its prefill until it is released. They outlive
  // runners: a preempted sequence may resume in another batch. Draws are keyed by position, so a
  // resumed sequence draws what it would have drawn.
  // With penalties, each also keeps the tokens they count: the prompt's, then each token fed back.
  struct SequenceSampling {
    SamplingParams params;
    std::unique_ptr<TokenHistory> history;  // when params.has_penalties()
  };
  std::mutex sampling_mu_;
  std::map<SequenceId, SequenceSampling> sampling_ ABSL_GUARDED_BY(sampling_mu_);
  BusyMeter busy_;
  BusyUnion computing_;
  IntervalUnion device_computing_;  // fed by GPU engines (ComputeEngine::set_device_busy)
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_DAEMON_STEP_SERVICE_H_
