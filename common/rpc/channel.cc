#include "common/rpc/channel.h"

namespace lamina {

std::shared_ptr<grpc::Channel> CreateControlChannel(const std::string& address,
                                                    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // In gRPC this is also the minimum time a connection attempt may take: keep it generous, or a
  // busy machine's slow accept aborts every attempt.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  args.SetMaxReceiveMessageSize(256 << 20);
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  return grpc::CreateCustomChannel(address, credentials, args);
}

}  // namespace lamina
