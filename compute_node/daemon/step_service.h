// lamina.v1.ComputeNode: runs the coordinator's iteration plans. For each plan: prefill the new
// sequences, decode the running ones (both through the same ComputeEngine, reaching memory nodes
// through RemoteAttention), then sample one token per sequence with its own sampler.
// A failed step samples nothing and names the memory nodes that could not be reached, so the
// coordinator can drop their sequences and send the plan again without them.
// Thread-safe: one stream is served at a time (a second waits).
#ifndef LAMINA_COMPUTE_NODE_DAEMON_STEP_SERVICE_H_
#define LAMINA_COMPUTE_NODE_DAEMON_STEP_SERVICE_H_

#include <map>
#include <mutex>

#include "common/metrics/busy_meter.h"
#include "compute_node/engine/compute_engine.h"
#include "compute_node/remote/remote_attention.h"
#include "compute_node/sampling/sampler.h"
#include "lamina/v1/node.grpc.pb.h"

namespace lamina {

class StepService final : public lamina::v1::ComputeNode::Service {
 public:
  StepService(ComputeEngine* engine, RemoteAttention* attention) : engine_(engine), attention_(attention) {}

  grpc::Status Step(grpc::ServerContext* context,
                    grpc::ServerReaderWriter<lamina::v1::StepResult, lamina::v1::StepPlan>* stream) override;

  // Runs one plan (exposed for tests).
  lamina::v1::StepResult RunPlan(const lamina::v1::StepPlan& plan);
  // Frees every sequence of a plan whose result the coordinator will never read.
  void Abandon(const lamina::v1::StepPlan& plan);
  // Time spent running plans.
  const BusyMeter& busy() const { return busy_; }

 private:
  std::mutex mu_;
  ComputeEngine* engine_;
  RemoteAttention* attention_;
  std::map<SequenceId, Sampler> samplers_;
  Tensor prefill_logits_, decode_logits_;
  BusyMeter busy_;
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_DAEMON_STEP_SERVICE_H_
