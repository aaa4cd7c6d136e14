// gRPC credentials from Lamina's TLS settings (common/security/tls_context.h): TLS when the
// settings turn it on, the clear otherwise.
#ifndef LAMINA_COMMON_RPC_TLS_CREDENTIALS_H_
#define LAMINA_COMMON_RPC_TLS_CREDENTIALS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/security/tls_context.h"
#include "grpcpp/grpcpp.h"

namespace lamina {

// A server's. InvalidArgument naming a file that cannot be read or parsed, or a key that is not
// the certificate's.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(const ServerTlsFiles& files);

// A client's, which checks the server's certificate against `tls.ca_file` (the system's roots when
// empty) and the host it dials. InvalidArgument naming a CA file that cannot be read or parsed.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> GrpcChannelCredentials(const ClientTls& tls);

}  // namespace lamina

#endif  // LAMINA_COMMON_RPC_TLS_CREDENTIALS_H_
