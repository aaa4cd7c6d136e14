// Who may make a gRPC call: clients present an API key (`authorization: Bearer KEY`), the
// cluster's own processes the cluster secret's token (`lamina-cluster-auth`). A server checks
// before it reads or changes anything; a client adds what it holds. With no keys (or no secret)
// configured, every call passes.
#ifndef LAMINA_COMMON_RPC_CALL_AUTH_H_
#define LAMINA_COMMON_RPC_CALL_AUTH_H_

#include <optional>
#include <string>

#include "common/security/api_keys.h"
#include "common/security/cluster_secret.h"
#include "grpcpp/grpcpp.h"

namespace lamina {

void AddClusterAuth(grpc::ClientContext* context, const std::optional<ClusterSecret>& secret);
void AddApiKey(grpc::ClientContext* context, const std::string& key);  // nothing for ""

// UNAUTHENTICATED, saying what is missing, unless the call carries a valid token of `secret`.
grpc::Status CheckClusterAuth(const grpc::ServerContext& context, const std::optional<ClusterSecret>& secret);
// UNAUTHENTICATED unless the call carries one of `keys` (or the cluster's token: the cluster's
// own tools need no client key).
grpc::Status CheckApiKey(const grpc::ServerContext& context, const ApiKeys& keys,
                         const std::optional<ClusterSecret>& secret = std::nullopt);

}  // namespace lamina

#endif  // LAMINA_COMMON_RPC_CALL_AUTH_H_
