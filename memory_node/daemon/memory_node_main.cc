// lamina-memory-node: holds KV caches and runs attention for the sequences the coordinator places
// here. Serves the data plane (per-layer q/k/v in, attention outputs out) on its data_port and
// lamina.v1.MemoryNode (freeing sequences) on its gRPC port; registers with the coordinator and
// sends heartbeats with its free KV slots. Stops cleanly on SIGINT or SIGTERM.
//
//   lamina-memory-node --topology FILE --name NODE
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cuda/device.h"
#include "common/flags/flags.h"
#include "common/model_config/model_config.h"
#include "common/net/sockets.h"
#include "common/rpc/channel.h"
#include "common/rpc/daemon.h"
#include "common/rpc/node_agent.h"
#include "common/rpc/tls_credentials.h"
#include "common/status/status_macros.h"
#include "common/threading/thread_pool.h"
#include "common/topology/kv_dtype.h"
#include "common/topology/topology.h"
#include "common/transport/transport.h"
#include "grpcpp/grpcpp.h"
#include "kv/attention/attention_executor.h"
#include "kv/service/kv_pool_service.h"
#include "lamina/v1/node.grpc.pb.h"
#include "memory_node/data_plane/attention_server.h"

namespace lamina {
namespace {

constexpr char kUsage[] =
    "usage: lamina-memory-node --topology FILE --name NODE\n"
    "  Runs memory node NODE of the topology: KV caches and attention for the sequences placed on\n"
    "  it. `lamina up FILE` starts it with the others.\n";

absl::Status Run(const std::vector<std::string>& args) {
  LAMINA_ASSIGN_OR_RETURN(cli::Flags flags, cli::Flags::Parse(args, {"topology", "name"}, {}));
  LAMINA_ASSIGN_OR_RETURN(Topology topology, LoadTopology(flags.String("topology", "")));
  const NodeSpec* spec = topology.Find(flags.String("name", ""));
  if (spec == nullptr || spec->kind != NodeKind::kMemory) {
    return absl::InvalidArgumentError(absl::StrCat(topology.path, ": no memory node named '", flags.String("name", ""), "'"));
  }
  LAMINA_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(topology.model_dir));
  LAMINA_ASSIGN_OR_RETURN(const std::optional<ClusterSecret> secret, ClusterSecret::Load(topology.cluster_secret_file));

  LAMINA_ASSIGN_OR_RETURN(DeviceSpec device, ParseDevice(spec->device));
  LAMINA_ASSIGN_OR_RETURN(const DType kv_dtype, ChooseKvDtype(spec->kv_dtype, config, device.is_cuda));
  ThreadPool pool(spec->threads);
  std::mutex executor_mu;
  LAMINA_ASSIGN_OR_RETURN(
      std::unique_ptr<AttentionExecutor> executor,
      AttentionExecutor::Create({config.num_layers,
                                 spec->kv_capacity_tokens,
                                 {config.num_q_heads, config.num_kv_heads, config.head_dim, config.sliding_window},
                                 device.is_cuda ? device.index : -1,
                                 kv_dtype},
                                &pool));
  // The connections from compute nodes are tcp, proving the cluster secret where there is one;
  // device links open on them (device_link.h).
  std::unique_ptr<Transport> transport = MakeTcpTransport(secret);
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<AttentionServer> data_plane,
                          AttentionServer::Start(
                              transport.get(), ListenAddress(spec->data_address()),
                              {config.num_layers, config.q_size(), config.kv_size(), config.num_kv_heads},
                              executor.get(), &executor_mu, executor.get()));

  KvPoolService service(executor.get(), &executor_mu, secret);
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<grpc::Server> server, StartGrpcServer(ListenAddress(spec->grpc_address()), {&service}));

  lamina::v1::RegisterRequest registration;
  registration.set_name(spec->name);
  registration.set_role(lamina::v1::NODE_ROLE_MEMORY);
  registration.set_grpc_address(spec->grpc_address());
  registration.set_data_address(spec->data_address());
  registration.set_kv_capacity_slots(spec->kv_capacity_tokens);
  registration.set_pid(::getpid());
  // A heartbeat waits at most 20 ms for the data plane (short attention calls come and go in
  // that time): while a long call holds the executor, it repeats the last counts it read, so a
  // busy node is not mistaken for a dead one.
  struct { int64_t free_slots, sequences, shared_slots; } counts{spec->kv_capacity_tokens, 0, 0};
  LAMINA_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> to_coordinator,
                          GrpcChannelCredentials(topology.coordinator_tls.ForClients()));
  NodeAgent agent(CreateControlChannel(topology.coordinator_address(), to_coordinator), registration, secret,
                  [&](lamina::v1::HeartbeatRequest* heartbeat) {
    std::unique_lock<std::mutex> lock(executor_mu, std::defer_lock);
    for (int tries = 0; tries < 20 && !lock.try_lock(); ++tries) absl::SleepFor(absl::Milliseconds(1));
    if (lock.owns_lock()) {
      counts = {executor->num_free_slots(), executor->num_sequences(), executor->num_shared_slots()};
    }
    heartbeat->set_kv_free_slots(counts.free_slots);
    heartbeat->set_num_sequences(counts.sequences);
    heartbeat->set_kv_shared_slots(counts.shared_slots);
    const BusyMeter::Snapshot busy = data_plane->busy().Read();
    heartbeat->mutable_load()->set_clock_seconds(busy.clock_seconds);
    heartbeat->mutable_load()->set_busy_seconds(busy.busy_seconds);
    heartbeat->mutable_load()->set_busy_count(busy.count);
    heartbeat->mutable_load()->set_attention_seconds(data_plane->decode_busy().Read().busy_seconds);
    heartbeat->mutable_load()->set_attended_rows(data_plane->attended_rows());
  }, [&] {
    std::lock_guard<std::mutex> lock(executor_mu);
    std::fprintf(stderr, "%s: a new coordinator: freeing the %lld sequences held for the last one\n",
                 spec->name.c_str(), static_cast<long long>(executor->num_sequences()));
    executor->FreeAll();
  });

  const int64_t slot_bytes = KvBytesPerToken(kv_dtype, config);
  std::fprintf(stderr, "%s: %lld KV slots in %s (%.1f MB), data plane on %s, gRPC on %s\n", spec->name.c_str(),
               static_cast<long long>(spec->kv_capacity_tokens), KvDtypeName(kv_dtype),
               spec->kv_capacity_tokens * slot_bytes / 1e6, data_plane->address().c_str(),
               spec->grpc_address().c_str());
  ServeUntilSignal(server.get(), absl::Milliseconds(500));
  return absl::OkStatus();
}

}  // namespace
}  // namespace lamina

int main(int argc, char** argv) {
  lamina::ConfigureCudaForWaitsOnOtherProcesses();
  return lamina::DaemonMain("lamina-memory-node", lamina::kUsage, argc, argv, lamina::Run);
}
