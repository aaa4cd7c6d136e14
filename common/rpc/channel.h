// gRPC channels for Lamina's control plane. Reconnect backoff is capped at one second (gRPC's
// default grows to two minutes), so a node or client that starts before its peer connects
// promptly once the peer is up. Calls that may precede the peer should set wait_for_ready and a
// deadline: with the synchronous API a connection attempt only progresses while a call waits.
#ifndef LAMINA_COMMON_RPC_CHANNEL_H_
#define LAMINA_COMMON_RPC_CHANNEL_H_

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"

namespace lamina {

// In the clear unless `credentials` say otherwise (GrpcChannelCredentials, for TLS).
std::shared_ptr<grpc::Channel> CreateControlChannel(const std::string& address,
                                                    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

}  // namespace lamina

#endif  // LAMINA_COMMON_RPC_CHANNEL_H_
