#include "common/rpc/daemon.h"

#include <cstdio>
#include <cstdlib>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "common/rpc/signals.h"

namespace lamina {

absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(const std::string& address,
                                                              const std::vector<grpc::Service*>& services,
                                                              std::shared_ptr<grpc::ServerCredentials> credentials) {
  // Every daemon answers grpc.health.v1.Health (SERVING once started; see SetServing) and server
  // reflection, for probes and tools such as grpcurl.
  static const bool standard_services = [] {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    return true;
  }();
  (void)standard_services;
  grpc::ServerBuilder builder;
  int bound_port = 0;
  if (credentials == nullptr) credentials = grpc::InsecureServerCredentials();
  builder.AddListeningPort(address, credentials, &bound_port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(256 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound_port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", address, " (port in use?)"));
  }
  return server;
}

void SetServing(grpc::Server* server, bool serving) {
  if (grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService()) health->SetServingStatus(serving);
}

void ServeUntilSignal(grpc::Server* server, absl::Duration grace) {
  WaitForTerminationSignal();
  server->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

void ConfigureCudaForWaitsOnOtherProcesses() {
  ::setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
}

int DaemonMain(const char* program, const char* usage, int argc, char** argv,
               const std::function<absl::Status(const std::vector<std::string>&)>& run) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", usage);
      return 0;
    }
    if (arg == "--version") {
      std::printf("%s %s\n", program, LAMINA_VERSION);
      return 0;
    }
  }
  if (args.empty()) {
    std::fprintf(stderr, "%s", usage);
    return 2;
  }
  // A crash writes its signal and stack to stderr (the node's log), then takes the default action.
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
  BlockTerminationSignals();
  absl::Status status = run(args);
  if (status.ok()) return 0;
  std::fprintf(stderr, "%s: %s\n", program, std::string(status.message()).c_str());
  return 1;
}

}  // namespace lamina
