// lamina-compute-node: holds the model weights and runs the model slices, prefill and sampling
// for the coordinator's iteration plans, reaching the memory nodes of the topology over the data
// plane. With `kv_capacity_tokens` on its topology entry it also holds a KV pool of its own on its
// device and attends the sequences placed there itself (local attention), serving
// lamina.v1.MemoryNode for that pool. Registers with the coordinator and sends heartbeats. Stops
// cleanly on SIGINT or SIGTERM.
//
//   lamina-compute-node --topology FILE --name NODE
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
#include "compute_node/daemon/step_service.h"
#include "compute_node/engine/device_engine.h"
#include "compute_node/local/local_pool.h"
#include "compute_node/local/placed_attention.h"
#include "compute_node/tensor_parallel/rank_group.h"
#include "compute_node/tensor_parallel/shard.h"
#include "grpcpp/grpcpp.h"
#include "kv/service/kv_pool_service.h"

namespace lamina {
namespace {

// What of the model this node holds: its share of a layer split, or all of it.
WeightShare WeightShareOf(const NodeSpec& spec) {
  return spec.splits_layers() ? WeightShare{spec.first_layer, spec.end_layer} : WeightShare{};
}

// This node's weights: its share of a layer split, or a tensor-parallel rank's slices (only they
// are read; random weights are drawn whole and cut: CPU ranks only so far), or the whole model.
absl::StatusOr<std::unique_ptr<DeviceWeights>> LoadWeights(const NodeSpec& spec, const DeviceSpec& device,
                                                           const std::string& model_dir,
                                                           std::optional<uint64_t> random_seed) {
  if (spec.tensor_parallel == 1) return DeviceWeights::Load(device, model_dir, random_seed, WeightShareOf(spec));
  if (device.is_cuda) {
    return absl::UnimplementedError(absl::StrCat("nodes '", spec.name, "': tensor parallelism runs on CPU ranks so "
                                                 "far; a rank on ", spec.device, " is not built yet"));
  }
  std::unique_ptr<ModelWeights> host;
  if (random_seed) {
    LAMINA_ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(model_dir));
    host = ModelWeights::Random(config, *random_seed);
    ShardWeights(spec.tp_rank, spec.tensor_parallel, host.get());
  } else {
    WeightShare share;
    share.rank = spec.tp_rank;
    share.ranks = spec.tensor_parallel;
    LAMINA_ASSIGN_OR_RETURN(host, ModelWeights::Load(model_dir, share));
  }
  return DeviceWeights::FromHost(device, std::move(host));
}

constexpr char kUsage[] =
    "usage: lamina-compute-node --topology FILE --name NODE\n"
    "  Runs compute node NODE of the topology: the model's weights and slices, and its own KV pool\n"
    "  when its entry sets kv_capacity_tokens. `lamina up FILE` starts it with the others.\n";

absl::Status Run(const std::vector<std::string>& args) {
  LAMINA_ASSIGN_OR_RETURN(cli::Flags flags, cli::Flags::Parse(args, {"topology", "name"}, {}));
  LAMINA_ASSIGN_OR_RETURN(Topology topology, LoadTopology(flags.String("topology", "")));
  const NodeSpec* spec = topology.Find(flags.String("name", ""));
  if (spec == nullptr || spec->kind != NodeKind::kCompute) {
    return absl::InvalidArgumentError(absl::StrCat(topology.path, ": no compute node named '", flags.String("name", ""), "'"));
  }
  LAMINA_ASSIGN_OR_RETURN(DeviceSpec device, ParseDevice(spec->device));
  LAMINA_ASSIGN_OR_RETURN(const ModelConfig model_config, LoadModelConfig(topology.model_dir));
  LAMINA_RETURN_IF_ERROR(CheckLayerSplit(topology, model_config.num_layers));
  const absl::Time started = absl::Now();  // start-up's stages are timed, for cold starts
  std::optional<uint64_t> random_seed;
  if (topology.random_weights) random_seed = topology.weights_seed;
  LAMINA_RETURN_IF_ERROR(CheckTensorParallel(topology, model_config));
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<DeviceWeights> weights,
                          LoadWeights(*spec, device, topology.model_dir, random_seed));
  const ModelConfig& config = weights->config();
  const absl::Time weights_loaded = absl::Now();

  std::map<std::string, std::string> memory_nodes;
  for (const NodeSpec* node : topology.NodesOf(NodeKind::kMemory)) memory_nodes[node->name] = node->data_address();
  // Device-side data planes to memory nodes on GPUs, as the topology allows for this pair.
  std::map<std::string, std::vector<std::string>> device_transports;
  for (const NodeSpec* node : topology.NodesOf(NodeKind::kMemory)) {
    device_transports[node->name] = TransportsBetween(*spec, *node);
    const std::vector<std::string>& written = node->transports;
    if (SameGpu(*spec, *node) && std::find(written.begin(), written.end(), "auto") != written.end()) {
      std::fprintf(stderr,
                   "memory node '%s': transport auto passes over cuda_ipc and nccl, as it shares %s with this node "
                   "(device links between processes of one GPU wait through each other's time slices)\n",
                   node->name.c_str(), spec->device.c_str());
    }
  }
  LAMINA_ASSIGN_OR_RETURN(const std::optional<ClusterSecret> secret, ClusterSecret::Load(topology.cluster_secret_file));
  std::unique_ptr<Transport> transport = MakeTcpTransport(secret);
  // A tensor-parallel rank joins its group before anything runs.
  std::unique_ptr<RankGroup> rank_group;
  if (spec->tensor_parallel > 1) {
    const NodeSpec* leader = topology.RanksOf(spec->tp_group).front();
    const std::string address = spec->tp_rank == 0 ? ListenAddress(leader->data_address()) : leader->data_address();
    LAMINA_ASSIGN_OR_RETURN(rank_group, RankGroup::Join(transport.get(), spec->tp_rank, spec->tensor_parallel, address,
                                                        absl::Milliseconds(topology.step_timeout_ms),
                                                        absl::Now() + absl::Seconds(60)));
  }
  ThreadPool pool(spec->threads);
  // A pool of its own: attended here, shared by the runners.
  std::unique_ptr<LocalPool> local_pool;
  std::unique_ptr<KvPoolService> pool_service;
  DType kv_dtype = DType::kF32;
  if (spec->kv_capacity_tokens > 0) {
    // A share of a group's pool, as plans name it (NodeSpec::pool_name): a tensor-parallel rank's
    // heads, or the layers a node of a layer split attends.
    LAMINA_ASSIGN_OR_RETURN(kv_dtype, ChooseKvDtype(spec->kv_dtype, config, device.is_cuda));
    const WeightShare share = WeightShareOf(*spec);
    const int64_t first_layer = share.FirstAttentionLayer();
    const int64_t layers = std::max<int64_t>(1, share.EndAttentionLayer(config) - first_layer);
    LAMINA_ASSIGN_OR_RETURN(local_pool,
                            LocalPool::Create({layers,
                                               spec->kv_capacity_tokens,
                                               {config.num_q_heads, config.num_kv_heads, config.head_dim,
                                                config.sliding_window},
                                               device.is_cuda ? device.index : -1,
                                               kv_dtype},
                                              &pool, first_layer));
    pool_service = std::make_unique<KvPoolService>(local_pool->executor(), local_pool->mu(), secret);
  }
  const absl::Time pool_made = absl::Now();
  // One runner (engine and data-plane connections) per batch the topology runs on this node.
  const int num_runners = std::max(1, topology.BatchesOn(spec->name));
  std::vector<std::unique_ptr<RemoteAttention>> remotes;
  std::vector<std::unique_ptr<PlacedAttention>> attentions;
  std::vector<std::unique_ptr<ComputeEngine>> engines;
  std::vector<BatchRunner> runners;
  // A step with more rows than its links hold takes the host path.
  const int64_t link_rows = topology.MostDecodeRows();
  // Device links open before this node registers, so that no step is under way anywhere yet.
  const absl::Time links_deadline = absl::Now() + absl::Seconds(60);
  for (int i = 0; i < num_runners; ++i) {
    RemoteAttention* remote = nullptr;
    if (!memory_nodes.empty()) {
      // A tensor-parallel rank's config holds its share of the heads; it sends and receives only
      // theirs (head-level partitioning).
      AttentionWireShape shape{config.num_layers, config.q_size(), config.kv_size(), config.num_kv_heads};
      if (spec->tensor_parallel > 1) shape.first_kv_head = spec->tp_rank * config.num_kv_heads;
      remotes.push_back(std::make_unique<RemoteAttention>(transport.get(), memory_nodes, shape, absl::Seconds(5)));
      remote = remotes.back().get();
      if (device.is_cuda) {
        remote->EnableDeviceLinks(device.index, link_rows, device_transports, kMaxDataPlaneChunks,
                                  spec->tuning.chunk_rows);
        remote->set_line_rows(spec->tuning.line_rows);
        remote->set_packet_rows(spec->tuning.packet_rows);
        remote->OpenDeviceLinks(links_deadline);
      }
    }
    LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<PlacedAttention> placed,
                            PlacedAttention::Create(local_pool.get(), spec->pool_name(), remote));
    attentions.push_back(std::move(placed));
    LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<ComputeEngine> engine, weights->MakeEngine(attentions.back().get(), &pool, rank_group.get()));
    engines.push_back(std::move(engine));
    runners.push_back({engines.back().get(), attentions.back().get(), rank_group.get()});
  }
  // Rotational pipelining over several compute nodes: an inbox for batches handed over by the
  // previous replica, and a relay per batch to the next one.
  std::unique_ptr<ResidualInbox> inbox;
  std::vector<std::unique_ptr<SliceRelay>> relays;
  std::vector<SliceRelay*> relay_ptrs;
  if (const int replicas = topology.RotationReplicas(); replicas > 0) {
    const std::vector<const NodeSpec*> computes = topology.NodesOf(NodeKind::kCompute);
    const int self = static_cast<int>(std::find(computes.begin(), computes.end(), spec) - computes.begin());
    const NodeSpec* next = computes[(self + 1) % replicas];
    const NodeSpec* previous = computes[(self + replicas - 1) % replicas];
    // Between GPUs of one host, batches go GPU to GPU: a pass's rows, up to a decode step's most
    // (max_batch + max_tokens_per_iteration: a prefill pass's token budget, or a step of decodes
    // and prompt chunks), larger passes (a whole prompt beyond the budget) through host memory.
    DeviceHandoffs handoffs;
    if (device.is_cuda) {
      handoffs.device = device.index;
      handoffs.shape = {link_rows, config.hidden_size, config.q_size(),
                        absl::Milliseconds(topology.step_timeout_ms)};
      handoffs.batches = num_runners;
    }
    const DeviceHandoffs to_next = next->host == spec->host ? handoffs : DeviceHandoffs{};
    const DeviceHandoffs from_previous = previous->host == spec->host ? handoffs : DeviceHandoffs{};
    LAMINA_ASSIGN_OR_RETURN(inbox, ResidualInbox::Start(transport.get(), ListenAddress(spec->data_address()), from_previous));
    for (int batch = 0; batch < num_runners; ++batch) {
      relays.push_back(std::make_unique<SliceRelay>(
          transport.get(), inbox.get(), topology.RouteOf(batch, self),
          RelayPeers{spec->name, next->name, next->data_address(), previous->name},
          absl::Milliseconds(topology.step_timeout_ms), to_next));
      relay_ptrs.push_back(relays.back().get());
    }
  }
  StepService service(runners, relay_ptrs, spec->gpu_busy_timing, secret);
  std::vector<grpc::Service*> services = {&service};
  if (pool_service != nullptr) services.push_back(pool_service.get());
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<grpc::Server> server, StartGrpcServer(ListenAddress(spec->grpc_address()), services));

  lamina::v1::RegisterRequest registration;
  registration.set_name(spec->name);
  registration.set_role(lamina::v1::NODE_ROLE_COMPUTE);
  registration.set_grpc_address(spec->grpc_address());
  registration.set_pid(::getpid());
  registration.set_kv_capacity_slots(spec->kv_capacity_tokens);
  // As a memory node reports its pool (memory_node_main.cc): a heartbeat waits at most 20 ms for
  // the pool's lock, else repeats the last counts.
  struct { int64_t free_slots, sequences, shared_slots; } counts{spec->kv_capacity_tokens, 0, 0};
  LAMINA_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> to_coordinator,
                          GrpcChannelCredentials(topology.coordinator_tls.ForClients()));
  NodeAgent agent(CreateControlChannel(topology.coordinator_address(), to_coordinator), registration, secret,
                  [&](lamina::v1::HeartbeatRequest* heartbeat) {
    if (local_pool != nullptr) {
      std::unique_lock<std::mutex> lock(*local_pool->mu(), std::defer_lock);
      for (int tries = 0; tries < 20 && !lock.try_lock(); ++tries) absl::SleepFor(absl::Milliseconds(1));
      if (lock.owns_lock()) {
        const AttentionExecutor* e = local_pool->executor();
        counts = {e->num_free_slots(), e->num_sequences(), e->num_shared_slots()};
      }
      heartbeat->set_kv_free_slots(counts.free_slots);
      heartbeat->set_num_sequences(counts.sequences);
      heartbeat->set_kv_shared_slots(counts.shared_slots);
    }
    const BusyMeter::Snapshot busy = service.busy().Read();
    const BusyMeter::Snapshot trips = service.RoundTrips();
    lamina::v1::NodeLoad* load = heartbeat->mutable_load();
    load->set_clock_seconds(busy.clock_seconds);
    // Computing, not waiting on attention: what is left idle shows the pipeline's bubbles.
    load->set_busy_seconds(service.ComputingSeconds());
    load->set_busy_count(busy.count);
    load->set_round_trip_seconds(trips.busy_seconds);
    load->set_round_trips(trips.count);
  }, [&] {
    std::fprintf(stderr, "%s: a new coordinator: forgetting the last one's sequences\n", spec->name.c_str());
    service.ForgetSequences();
    if (local_pool != nullptr) local_pool->With([](AttentionExecutor& e) { e.FreeAll(); });
  });

  const std::string own_pool =
      local_pool == nullptr
          ? ""
          : absl::StrFormat(", its own KV pool of %lld slots in %s (%.1f MB)",
                            static_cast<long long>(spec->kv_capacity_tokens), KvDtypeName(kv_dtype),
                            // KvBytesPerToken counts every layer; the pool holds its own.
                            spec->kv_capacity_tokens * KvBytesPerToken(kv_dtype, config) / 1e6 *
                                local_pool->options().num_layers / config.num_layers);
  // What of the model it computes: all of it, a layer split's range, or a tensor-parallel rank.
  std::string share = absl::StrCat(config.num_layers, " layers");
  if (spec->splits_layers()) share = absl::StrCat("layers ", spec->first_layer, "..", spec->end_layer - 1);
  if (spec->tensor_parallel > 1) {
    absl::StrAppend(&share, ", tensor-parallel rank ", spec->tp_rank, " of ", spec->tensor_parallel, " (",
                    config.num_q_heads, " query heads)");
  }
  std::fprintf(stderr, "%s: %s, %s%s on %s, gRPC on %s%s, %zu memory nodes, %d batch runner%s%s\n",
               spec->name.c_str(), config.architecture.c_str(), share.c_str(),
               topology.random_weights ? " (random weights)" : "", spec->device.c_str(),
               spec->grpc_address().c_str(), own_pool.c_str(), memory_nodes.size(), num_runners,
               num_runners == 1 ? "" : "s", inbox ? absl::StrCat(", hand-overs on ", inbox->address()).c_str() : "");
  const absl::Time ready = absl::Now();
  std::fprintf(stderr, "%s: ready in %.2f s (weights %.2f s, KV pool %.2f s, engines and links %.2f s)\n",
               spec->name.c_str(), absl::ToDoubleSeconds(ready - started),
               absl::ToDoubleSeconds(weights_loaded - started), absl::ToDoubleSeconds(pool_made - weights_loaded),
               absl::ToDoubleSeconds(ready - pool_made));
  ServeUntilSignal(server.get(), absl::Milliseconds(500));
  return absl::OkStatus();
}

}  // namespace
}  // namespace lamina

int main(int argc, char** argv) {
  lamina::ConfigureCudaForWaitsOnOtherProcesses();
  return lamina::DaemonMain("lamina-compute-node", lamina::kUsage, argc, argv, lamina::Run);
}
