#include "deploy/client/cluster_client.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/rpc/call_auth.h"
#include "common/rpc/channel.h"
#include "common/rpc/tls_credentials.h"
#include "common/status/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace lamina::cli {

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

namespace {

std::string Environment(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

ClientAccess AccessFromFlags(const Flags& flags, const Topology* topology) {
  ClientAccess access;
  access.api_key = flags.String("api-key", Environment("LAMINA_API_KEY"));
  const std::string ca = flags.String("tls-ca", Environment("LAMINA_TLS_CA"));
  if (!ca.empty()) {
    access.tls = ClientTls{true, ca};
  } else if (flags.Has("tls")) {
    access.tls = ClientTls{true, ""};
  } else if (topology != nullptr) {
    access.tls = topology->coordinator_tls.ForClients();
  }
  return access;
}

absl::StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Connect(const std::string& endpoint,
                                                                      const ClientAccess& access) {
  LAMINA_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials, GrpcChannelCredentials(access.tls));
  return std::unique_ptr<ClusterClient>(
      new ClusterClient(endpoint, access.api_key, access.tls.enabled, CreateControlChannel(endpoint, credentials)));
}

ClusterClient::ClusterClient(const std::string& endpoint, std::string api_key, bool tls,
                             std::shared_ptr<grpc::Channel> channel)
    : endpoint_(endpoint),
      api_key_(std::move(api_key)),
      tls_(tls),
      channel_(std::move(channel)),
      generation_(lamina::v1::Generation::NewStub(channel_)),
      cluster_(lamina::v1::Cluster::NewStub(channel_)) {}

absl::Status ClusterClient::Explain(const grpc::Status& status) const {
  absl::Status plain = FromGrpc(status);
  const bool unreached = (absl::IsUnavailable(plain) || absl::IsDeadlineExceeded(plain)) &&
                         channel_->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY;
  if (!unreached) return plain;
  return absl::Status(plain.code(), absl::StrCat("no cluster answers at ", endpoint_, " (", plain.message(),
                                                 "): start one with `lamina up TOPOLOGY`, or check --endpoint",
                                                 tls_ ? " and --tls-ca" : " (and, if it uses TLS, give --tls-ca FILE)"));
}

absl::Status ClusterClient::Generate(const lamina::v1::GenerateRequest& request,
                                     const std::function<void(const lamina::v1::GenerateResponse&)>& on_response,
                                     absl::Duration timeout) {
  grpc::ClientContext context;
  if (timeout != absl::InfiniteDuration()) context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  AddApiKey(&context, api_key_);
  std::unique_ptr<grpc::ClientReader<lamina::v1::GenerateResponse>> reader = generation_->Generate(&context, request);
  lamina::v1::GenerateResponse response;
  while (reader->Read(&response)) on_response(response);
  return Explain(reader->Finish());
}

absl::StatusOr<lamina::v1::ClusterStatusResponse> ClusterClient::Status(absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  AddApiKey(&context, api_key_);
  lamina::v1::ClusterStatusResponse response;
  grpc::Status status = cluster_->ClusterStatus(&context, {}, &response);
  if (!status.ok()) return Explain(status);
  return response;
}

absl::StatusOr<lamina::v1::ListModelsResponse> ClusterClient::ListModels(absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  AddApiKey(&context, api_key_);
  lamina::v1::ListModelsResponse response;
  grpc::Status status = generation_->ListModels(&context, {}, &response);
  if (!status.ok()) return Explain(status);
  return response;
}

absl::StatusOr<lamina::v1::HealthResponse> ClusterClient::Health(absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  AddApiKey(&context, api_key_);
  context.set_wait_for_ready(true);  // wait for (and so drive) the connection until the deadline
  lamina::v1::HealthResponse response;
  grpc::Status status = generation_->Health(&context, {}, &response);
  if (!status.ok()) return Explain(status);
  return response;
}

}  // namespace lamina::cli
