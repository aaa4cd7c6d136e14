// The CLI's calls to a running cluster over its public gRPC API.
#ifndef LAMINA_DEPLOY_CLIENT_CLUSTER_CLIENT_H_
#define LAMINA_DEPLOY_CLIENT_CLUSTER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/flags/flags.h"
#include "common/security/tls_context.h"
#include "common/topology/topology.h"
#include "lamina/v1/cluster.grpc.pb.h"
#include "lamina/v1/generation.grpc.pb.h"

namespace lamina::cli {

// How the CLI reaches a coordinator: with which API key, over TLS or not.
struct ClientAccess {
  std::string api_key;  // "": none
  ClientTls tls;
};

// From the flags --api-key KEY (else LAMINA_API_KEY), --tls-ca FILE (else LAMINA_TLS_CA) and --tls
// (the system's roots), and else `topology`'s coordinator.tls when one is given.
ClientAccess AccessFromFlags(const Flags& flags, const Topology* topology);

class ClusterClient {
 public:
  // Calls carry `access.api_key` as `authorization: Bearer KEY`. InvalidArgument names a TLS CA
  // file that cannot be read.
  static absl::StatusOr<std::unique_ptr<ClusterClient>> Connect(const std::string& endpoint,
                                                                const ClientAccess& access);

  // Streams one request; `on_response` sees every response in order. Returns the call's status
  // (DeadlineExceeded when the whole call outlasts `timeout`). Every call's Unavailable or
  // DeadlineExceeded for a cluster it could not reach says so and what to do.
  absl::Status Generate(const lamina::v1::GenerateRequest& request,
                        const std::function<void(const lamina::v1::GenerateResponse&)>& on_response,
                        absl::Duration timeout = absl::InfiniteDuration());
  absl::StatusOr<lamina::v1::ListModelsResponse> ListModels(absl::Duration timeout);
  absl::StatusOr<lamina::v1::ClusterStatusResponse> Status(absl::Duration timeout);
  absl::StatusOr<lamina::v1::HealthResponse> Health(absl::Duration timeout);

  const std::string& endpoint() const { return endpoint_; }

 private:
  ClusterClient(const std::string& endpoint, std::string api_key, bool tls, std::shared_ptr<grpc::Channel> channel);
  // A call's status; when the cluster could not be reached, saying what to do about it.
  absl::Status Explain(const grpc::Status& status) const;

  std::string endpoint_;
  std::string api_key_;
  bool tls_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<lamina::v1::Generation::Stub> generation_;
  std::unique_ptr<lamina::v1::Cluster::Stub> cluster_;
};

// grpc::Status -> absl::Status.
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace lamina::cli

#endif  // LAMINA_DEPLOY_CLIENT_CLUSTER_CLIENT_H_
