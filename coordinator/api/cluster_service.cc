#include "coordinator/api/cluster_service.h"

#include <random>

#include "common/rpc/call_auth.h"
#include "coordinator/api/generation_service.h"

namespace lamina {

ClusterService::ClusterService(std::string model_name, int heartbeat_interval_ms, Membership* membership,
                               Scheduler* scheduler, std::optional<ClusterSecret> secret, ApiKeys keys)
    : model_name_(std::move(model_name)),
      heartbeat_interval_ms_(heartbeat_interval_ms),
      // Never 0, which a node takes for "no coordinator yet".
      epoch_(std::random_device()() * uint64_t{4294967296} + std::random_device()() + 1),
      membership_(membership),
      scheduler_(scheduler),
      secret_(std::move(secret)),
      keys_(std::move(keys)) {}

grpc::Status ClusterService::Register(grpc::ServerContext* context, const lamina::v1::RegisterRequest* request,
                                      lamina::v1::RegisterResponse* response) {
  // A stranger may not take a node's name (one claiming a pool of one slot stalled every request).
  if (grpc::Status auth = CheckClusterAuth(*context, secret_); !auth.ok()) return auth;
  absl::Status status = membership_->Register(*request);
  if (!status.ok()) return ToGrpc(status);
  response->set_heartbeat_interval_ms(heartbeat_interval_ms_);
  response->set_coordinator_epoch(epoch_);
  return grpc::Status::OK;
}

grpc::Status ClusterService::Heartbeat(grpc::ServerContext* context, const lamina::v1::HeartbeatRequest* request,
                                       lamina::v1::HeartbeatResponse* response) {
  if (grpc::Status auth = CheckClusterAuth(*context, secret_); !auth.ok()) return auth;
  response->set_known(membership_->Heartbeat(*request));
  return grpc::Status::OK;
}

grpc::Status ClusterService::ClusterStatus(grpc::ServerContext* context, const lamina::v1::ClusterStatusRequest*,
                                           lamina::v1::ClusterStatusResponse* response) {
  if (grpc::Status auth = CheckApiKey(*context, keys_, secret_); !auth.ok()) return auth;
  const absl::Time now = absl::Now();
  SchedulerStats stats = scheduler_->Stats();
  for (const MemberInfo& m : membership_->Snapshot()) {
    auto* node = response->add_nodes();
    node->set_name(m.spec.name);
    node->set_role(m.spec.kind == NodeKind::kMemory ? lamina::v1::NODE_ROLE_MEMORY : lamina::v1::NODE_ROLE_COMPUTE);
    node->set_healthy(m.alive());
    node->set_detail(!m.registered ? "not registered" : m.dead ? m.dead_reason : "");
    node->set_grpc_address(m.spec.grpc_address());
    node->set_kv_capacity_slots(m.kv_capacity_slots);
    node->set_kv_free_slots(m.kv_free_slots);
    node->set_kv_used_slots(m.kv_capacity_slots - m.kv_free_slots);
    node->set_num_sequences(m.num_sequences);
    node->set_pid(m.pid);
    node->set_kv_shared_slots(m.kv_shared_slots);
    if (auto cached = stats.cached.find(m.spec.name); cached != stats.cached.end()) {
      node->set_kv_cached_slots(cached->second.slots);
      node->set_cached_sequences(cached->second.sequences);
    }
    *node->mutable_load() = m.load;
    node->set_last_heartbeat_ms(m.registered ? absl::ToInt64Milliseconds(now - m.last_heard) : -1);
  }
  response->set_queue_length(stats.queued);
  response->set_running(stats.running);
  response->set_tokens_per_second(stats.tokens_per_second);
  response->set_completed(stats.completed);
  response->set_failed(stats.failed);
  response->set_cancelled(stats.cancelled);
  response->set_preemptions(stats.preemptions);
  response->set_iterations(stats.iterations);
  response->set_decoded_sequences(stats.decoded_sequences);
  response->set_prefilled_tokens(stats.prefilled_tokens);
  response->set_iteration_seconds(stats.iteration_seconds);
  for (int64_t running : stats.running_per_batch) response->add_running_per_batch(running);
  response->set_pipelining(scheduler_->pipelining());
  response->set_model(model_name_);
  return grpc::Status::OK;
}

}  // namespace lamina
