// lamina.v1.Cluster: node registration and heartbeats, and the status `lamina status` shows.
// Thread-safe.
#ifndef LAMINA_COORDINATOR_API_CLUSTER_SERVICE_H_
#define LAMINA_COORDINATOR_API_CLUSTER_SERVICE_H_

#include <optional>
#include <string>

#include "common/security/api_keys.h"
#include "common/security/cluster_secret.h"
#include "coordinator/cluster/membership.h"
#include "coordinator/scheduler/scheduler.h"
#include "lamina/v1/cluster.grpc.pb.h"

namespace lamina {

class ClusterService final : public lamina::v1::Cluster::Service {
 public:
  // Registration and heartbeats need `secret`'s token, status one of `keys` (or the token), when
  // there are any.
  ClusterService(std::string model_name, int heartbeat_interval_ms, Membership* membership, Scheduler* scheduler,
                 std::optional<ClusterSecret> secret = std::nullopt, ApiKeys keys = ApiKeys());

  grpc::Status Register(grpc::ServerContext*, const lamina::v1::RegisterRequest* request,
                        lamina::v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const lamina::v1::HeartbeatRequest* request,
                         lamina::v1::HeartbeatResponse* response) override;
  grpc::Status ClusterStatus(grpc::ServerContext*, const lamina::v1::ClusterStatusRequest* request,
                             lamina::v1::ClusterStatusResponse* response) override;

 private:
  std::string model_name_;
  int heartbeat_interval_ms_;
  const uint64_t epoch_;  // this coordinator's (RegisterResponse.coordinator_epoch)
  Membership* membership_;
  Scheduler* scheduler_;
  const std::optional<ClusterSecret> secret_;
  const ApiKeys keys_;
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_API_CLUSTER_SERVICE_H_
