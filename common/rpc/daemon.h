// What the three daemons share: starting a gRPC server, serving until SIGINT or SIGTERM, and a
// main() that reports a start-up failure in one line and exits non-zero.
#ifndef LAMINA_COMMON_RPC_DAEMON_H_
#define LAMINA_COMMON_RPC_DAEMON_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace lamina {

// Builds and starts a gRPC server on `address` with `services`, grpc.health.v1.Health (SERVING)
// and server reflection, in the clear unless `credentials`
// say otherwise (GrpcServerCredentials, for TLS); Unavailable names the address when it cannot
// be bound.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);

// What the server's grpc.health.v1.Health answers for every service: SERVING or NOT_SERVING.
void SetServing(grpc::Server* server, bool serving);

// Blocks until SIGINT or SIGTERM, then shuts `server` down, cancelling calls still running after
// `grace`.
void ServeUntilSignal(grpc::Server* server, absl::Duration grace);

// The body of a daemon's main(): with --help (or no arguments) prints `usage` (and exits 0, or 2
// without arguments), with --version the version; otherwise has a crash (SIGSEGV, SIGBUS,
// SIGABRT, ...) print its stack to stderr before the process dies of it, blocks the termination
// signals (so that ServeUntilSignal can take them), runs `run` on the arguments, and on failure
// prints "PROGRAM: message" and returns 1.
int DaemonMain(const char* program, const char* usage, int argc, char** argv,
               const std::function<absl::Status(const std::vector<std::string>&)>& run);

// For daemons whose GPU work waits on other processes (the device data planes, hand-overs
// between compute nodes), two CUDA settings, each kept where the environment sets it already:
//  - CUDA loads every kernel when the process starts rather than at its first launch
//    (CUDA_MODULE_LOADING=EAGER), since a lazy load waits for the GPU to go idle, which may not
//    happen while a wait queued ahead spins on another node that is itself waiting.
//  - Streams get 32 hardware queues, CUDA's most, rather than 8 (CUDA_DEVICE_MAX_CONNECTIONS).
//    Streams beyond the queues share them, and a kernel spinning at the head of one (a wait for a
//    peer, an NCCL exchange) then holds back the other streams' kernels behind it, which may be
//    the ones its peer waits for (a rotating cluster with a dozen streams a GPU stalled so at 8).
// Call first in main, before any CUDA call.
void ConfigureCudaForWaitsOnOtherProcesses();

}  // namespace lamina

#endif  // LAMINA_COMMON_RPC_DAEMON_H_
