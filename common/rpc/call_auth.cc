#include "common/rpc/call_auth.h"

#include "absl/time/clock.h"

namespace lamina {
namespace {

// The first value of metadata `key`, or "".
std::string Metadata(const grpc::ServerContext& context, const char* key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(key);
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

}  // namespace

void AddClusterAuth(grpc::ClientContext* context, const std::optional<ClusterSecret>& secret) {
  if (secret) context->AddMetadata(kClusterAuthMetadata, secret->CallToken(absl::Now()));
}

void AddApiKey(grpc::ClientContext* context, const std::string& key) {
  if (!key.empty()) context->AddMetadata("authorization", "Bearer " + key);
}

grpc::Status CheckClusterAuth(const grpc::ServerContext& context, const std::optional<ClusterSecret>& secret) {
  if (!secret) return grpc::Status::OK;
  const absl::Status checked = secret->CheckCallToken(Metadata(context, kClusterAuthMetadata), absl::Now());
  if (checked.ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(checked.message()));
}

grpc::Status CheckApiKey(const grpc::ServerContext& context, const ApiKeys& keys,
                         const std::optional<ClusterSecret>& secret) {
  if (!keys.enabled()) return grpc::Status::OK;
  if (keys.Accepts(ApiKeys::FromBearer(Metadata(context, "authorization")))) return grpc::Status::OK;
  if (secret && secret->CheckCallToken(Metadata(context, kClusterAuthMetadata), absl::Now()).ok()) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "no valid API key: send metadata 'authorization: Bearer KEY' (lamina ... --api-key, or "
                      "LAMINA_API_KEY)");
}

}  // namespace lamina
