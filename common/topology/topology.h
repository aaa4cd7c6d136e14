// A cluster's topology, read from YAML (schema: deploy/TOPOLOGY.md). Everything is validated
// before anything starts, and an error names the file, the line and the field:
//   "deploy/topologies/x.yaml:14: nodes[1].kv_capacity_tokens: expected a positive integer, got 'lots'".
// Immutable after loading; thread-safe to read.
#ifndef LAMINA_COMMON_TOPOLOGY_TOPOLOGY_H_
#define LAMINA_COMMON_TOPOLOGY_TOPOLOGY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config/model_config.h"
#include "common/security/tls_context.h"
#include "common/topology/slice_route.h"

namespace lamina {

enum class NodeKind { kCompute, kMemory };

// A layer's decode rows to a memory node travel in at most this many chunks.
inline constexpr int kMaxDataPlaneChunks = 4;
// Rows per chunk below which a layer is not split: smaller chunks cost more than they hide of the
// transfer behind attention (the data plane's figures: tests/bench/RESULTS.md).
inline constexpr int64_t kDefaultChunkRows = 256;
// Over cuda_ipc, decode chunks of at most this many rows travel as lines (kernels/cuda/line.h),
// about twice as fast as rows behind a flag at a few rows; at most kMostLineRows, the rows one
// receiving launch takes.
inline constexpr int64_t kMostLineRows = 32;
inline constexpr int64_t kDefaultLineRows = kMostLineRows;
// Over cuda_ipc between GPUs joined by NVLink, larger decode chunks of at most this many rows (by
// default every one) travel as packets (kernels/cuda/packets.h): faster than rows behind a flag up
// to a few hundred rows, and no slower beyond.
inline constexpr int64_t kDefaultPacketRows = int64_t{1} << 20;

// How a compute node's decode rows travel over device links: a node entry's optional `tuning:`
// block (deploy/TOPOLOGY.md). The defaults suit most; these exist for measuring.
struct DataPlaneTuning {
  // A layer goes to a memory node in up to kMaxDataPlaneChunks mini-batches of at least this many
  // rows (communication-attention overlap); 0 sends one.
  int64_t chunk_rows = kDefaultChunkRows;
  // Over cuda_ipc, a chunk of 1 to this many rows travels as lines, which the receiver polls,
  // rather than rows behind a flag; 0 never.
  int64_t line_rows = kDefaultLineRows;
  // Over cuda_ipc between GPUs joined by NVLink, a chunk of more than line_rows and at most this
  // many rows travels as packets; 0 never.
  int64_t packet_rows = kDefaultPacketRows;
};

struct NodeSpec {
  std::string name;
  NodeKind kind = NodeKind::kCompute;
  std::string host = "127.0.0.1";
  int port = 0;                     // gRPC
  // Memory nodes: the data plane. Compute nodes (optional, 0 = none): where batches are handed
  // over from the previous replica under rotational pipelining over several compute nodes.
  int data_port = 0;
  std::string device = "cpu";
  // Memory nodes: how compute nodes reach the data plane's decode steps, in order of preference,
  // as written (tcp, cuda_ipc, nccl, rdma, auto); TransportsBetween gives a compute node's list.
  std::vector<std::string> transports = {"tcp"};
  // Memory nodes: the KV pool's size in token slots. Compute nodes (optional, 0 = none): a pool of
  // their own on their device, attended in their own process (local attention).
  int64_t kv_capacity_tokens = 0;
  // The KV pool's element type, "auto", "float32", "bfloat16" or "float8_e4m3" (kv_dtype.h).
  std::string kv_dtype = "auto";
  int threads = 0;                  // CPU threads for kernels; 0 = one per core
  // Compute nodes on a GPU: busy time measured on the device (CUDA events between the slices and
  // the exchanges) rather than on the host, where the GPU's waits count as computing.
  bool gpu_busy_timing = false;
  // Compute nodes: the data plane's wire formats, from the entry's optional `tuning:` block.
  DataPlaneTuning tuning;
  // Compute nodes (optional): a layer split, `layers: [first, end)`: this node computes layers
  // first .. end - 1 of every batch (slice_route.h); -1 when the node computes every layer.
  int64_t first_layer = -1;
  int64_t end_layer = -1;
  // Compute nodes (optional): a tensor-parallel group, `tensor_parallel: N`: the entry runs as N
  // processes (ranks), each holding 1/N of every layer's heads and MLP and of the LM head, joined
  // by all-reduces. Rank r listens on `port` + r and `data_port` + r, on `devices[r]` when the
  // entry lists `devices`; rank 0 keeps the entry's name, rank r > 0 is named "<name>-rank<r>".
  // The group's KV pool (kv_capacity_tokens) is rank 0's in the coordinator's accounting; each
  // rank holds its heads' share of every slot. On memory nodes, each rank sends and receives only
  // its heads' rows (AttentionWireShape::first_kv_head).
  int tensor_parallel = 1;
  int tp_rank = 0;
  std::string tp_group;  // the entry's name (rank 0's); empty without tensor parallelism
  // The hardware the node stands for, a device kind of the price table (e.g. "h100"): what cost
  // reports charge for it. Defaults to "cpu" on the CPU and to nothing on a GPU.
  std::string price_kind;
  int line = 0;                     // where the node is defined, for messages

  // The KV pool this node's kv_capacity_tokens is part of: its own (empty), or a group's, whose
  // nodes each hold a share of every slot (a layer split's nodes their layers, named after the
  // first; a tensor-parallel group's ranks their heads, named after the group).
  std::string kv_pool;
  std::string pool_name() const { return !kv_pool.empty() ? kv_pool : !tp_group.empty() ? tp_group : name; }

  // A node the coordinator places sequences on, whose pool it accounts: a memory node, or a
  // compute node with a pool of its own (the first of a group sharing one).
  bool holds_kv() const { return kv_capacity_tokens > 0 && pool_name() == name; }
  bool splits_layers() const { return first_layer >= 0; }
  std::string grpc_address() const { return host + ":" + std::to_string(port); }
  std::string data_address() const { return host + ":" + std::to_string(data_port); }
};

struct Topology {
  std::string path;       // the YAML file
  std::string model_dir;  // resolved against the file's folder
  // `weights: random`: the compute nodes draw weights of config.json's shape from `weights_seed`
  // instead of reading a checkpoint (for experiments on a model's shape alone; the outputs are
  // noise). Every node of a cluster draws the same weights for the same seed and device kind.
  bool random_weights = false;
  int64_t weights_seed = 0;
  std::string coordinator_host = "127.0.0.1";
  int coordinator_port = 0;
  // The OpenAI-compatible HTTP API's port on coordinator_host (coordinator/openai/); 0: none.
  int coordinator_http_port = 0;
  // Client API keys (common/security/api_keys.h): a file of keys, one a line, resolved against
  // the topology's folder ("": none; LAMINA_API_KEY adds one). With keys, /health and /metrics
  // (and gRPC's Health) stay open unless `open_probes` is false.
  std::string api_key_file;
  bool open_probes = true;
  // `coordinator.tls: {cert, key, ca}`: the coordinator's HTTP and gRPC APIs over TLS (paths
  // resolved against the topology's folder); the nodes, `lamina up` and the CLI given this
  // topology trust `ca` (or the certificate itself). Empty: in the clear.
  ServerTlsFiles coordinator_tls;
  // The secret internal calls and data-plane connections prove (common/security/
  // cluster_secret.h): a file, resolved against the topology's folder ("": LAMINA_CLUSTER_SECRET,
  // or none).
  std::string cluster_secret_file;
  int max_batch = 64;
  int max_tokens_per_iteration = 4096;
  // Prompts longer than what an iteration's token budget has left are prefilled in chunks over
  // several iterations, alongside the running sequences' decodes (which then never wait behind a
  // whole long prompt); off, such a prompt waits for an iteration with room, or runs alone.
  bool chunked_prefill = true;
  int heartbeat_interval_ms = 500;
  int heartbeat_timeout_ms = 3000;
  bool prefix_caching = true;  // keep prompt prefixes on memory nodes for reuse
  int step_timeout_ms = 30000;  // a step running longer is aborted (its batch ends UNAVAILABLE)
  // A request whose node fails (its KV pool's, or its batch's compute node) is recomputed on the
  // surviving pools, at most this many times; past that it ends with UNAVAILABLE.
  int max_migrations = 3;
  // On SIGTERM the coordinator stops admitting and lets requests in flight finish for this long
  // before it stops.
  int shutdown_grace_s = 30;
  // Batches in flight (the paper's staggered pipelining): `none`, one batch on the one compute
  // node; `fixed`, one batch per compute node; `rotational`, with one compute node two batches
  // alternating on it, and over R > 1 compute nodes R + 1 batches, slice k of batch j running on
  // compute node (j + k) mod R (each compute node then needs a data_port); `auto` (the default), `fixed`
  // with several compute nodes, and with one, `none` until more than `rotational_above` requests
  // are running or waiting, then `rotational` (below that a second batch gains little;
  // deploy/TOPOLOGY.md).
  std::string pipelining = "auto";
  int rotational_above = 80;
  // With several batches in flight, send each batch's step a share of a layer's time after the
  // others' (coordinator/scheduler/step_stagger.h), so that batches meeting on one compute node
  // take their slices in turn. Off by default: it gained nothing measurable on one GPU
  // (deploy/experiments/results/README.md).
  bool stagger = false;
  // Where the coordinator places a new sequence when its batch's compute node has a pool of its own
  // and memory nodes have room too: `local_first` (the default: the compute node's pool while it
  // has room, so that no step pays a round trip it need not), `offload_first` (memory nodes
  // first, the local pool when they are full), or `balanced` (as local_first, but a memory node
  // takes no more of the batch's rows than it attends within the compute node's step, judged
  // from their measured rates, so that a slow memory node adds room without slowing the batch;
  // requests wait beyond that).
  std::string placement = "local_first";
  std::vector<NodeSpec> nodes;
  std::map<std::string, double> prices;  // device kind -> dollars per hour

  std::string coordinator_address() const { return coordinator_host + ":" + std::to_string(coordinator_port); }
  std::string coordinator_http_address() const {
    return coordinator_host + ":" + std::to_string(coordinator_http_port);
  }
  // nullptr when absent.
  const NodeSpec* Find(const std::string& name) const;
  // The nodes that hold KV caches: memory nodes and compute nodes with a pool of their own.
  std::vector<const NodeSpec*> KvNodes() const;
  // The nodes holding a share of KV pool `pool` (NodeSpec::pool_name), in file and rank order:
  // the pool's own node, or every node of the group sharing it.
  std::vector<const NodeSpec*> PoolMembers(const std::string& pool) const;
  // Nodes of `kind`; for compute nodes, one per entry (a tensor-parallel group's rank 0). Every
  // process, ranks included, is in `nodes`.
  std::vector<const NodeSpec*> NodesOf(NodeKind kind) const;
  // The processes of compute node `name`: its ranks in order (itself alone without tensor
  // parallelism); empty for an unknown name.
  std::vector<const NodeSpec*> RanksOf(const std::string& name) const;
  // The compute node of each batch in flight, in the order the coordinator drives them (under
  // rotation over several compute nodes, the one running the batch's first slice).
  std::vector<const NodeSpec*> BatchComputeNodes() const;
  // R when each batch spreads over R > 1 compute nodes (every batch then runs on all of them, in
  // topology order): `rotational` pipelining, or a layer split; else 0.
  int RotationReplicas() const;
  // Whether the compute nodes split the model's layers among them (`layers:`); they then run as
  // R + 1 batches in flight, each through every node in topology order, as a pipeline.
  bool LayerSplit() const;
  // Batch `batch`'s route as seen by the `replica`-th compute node (RotationReplicas() > 0).
  SliceRoute RouteOf(int batch, int replica) const;
  // `auto` on one compute node: the second batch admits only above `rotational_above` requests.
  bool SecondBatchOnDemand() const;
  // How many batches run on a compute node: the engines (lanes) it keeps.
  int BatchesOn(const std::string& compute_node) const;
  // The most rows a decode step sends to the memory nodes, what a compute node's device links
  // hold: its decodes (max_batch) and the tokens of prompts that continue an earlier chunk or a
  // cached prefix, which run on the decode path a row a token within the step's token budget. A
  // prompt larger than the whole budget, prefilled whole, may send more.
  int64_t MostDecodeRows() const;
};

// The transports `compute` tries for `memory`'s decode steps, in order, the first that opens
// being used, up to tcp (the host path, which always opens): the memory node's list with `auto`
// resolved for this pair, as cuda_ipc (GPUs of one host), nccl (GPUs), then tcp; but neither
// device link when both nodes are on one GPU, where processes take turns (CUDA time-slices them)
// and a device link's spinning waits last through the other's turns (several times slower than
// tcp there; tests/bench/RESULTS.md). A cuda_ipc named
// outright is kept on one GPU (SharedGpuWarnings warns of it) and left out across hosts, where
// CUDA IPC cannot reach. No duplicates.
std::vector<std::string> TransportsBetween(const NodeSpec& compute, const NodeSpec& memory);

// A layer split must cover the model's `num_layers` layers exactly once, in topology order:
// InvalidArgument naming the node, its range and the model's count otherwise. OK without a split.
absl::Status CheckLayerSplit(const Topology& topology, int64_t num_layers);

// A tensor-parallel group of N ranks must divide the model's query and KV heads, its MLP's
// intermediate size and (an untied LM head) its vocabulary by N: InvalidArgument naming the node,
// the field and the numbers otherwise. OK without tensor parallelism.
absl::Status CheckTensorParallel(const Topology& topology, const ModelConfig& config);

// Both nodes on one GPU of one host.
bool SameGpu(const NodeSpec& a, const NodeSpec& b);

// Parses YAML text; `path` names it in messages and relative model paths resolve against its folder.
absl::StatusOr<Topology> ParseTopology(const std::string& yaml_text, const std::string& path);
absl::StatusOr<Topology> LoadTopology(const std::string& path);

// Checks that every port of the topology's processes on `host` (every process when empty) can be
// bound on this machine now; FailedPrecondition names the line, the node and the port in use.
absl::Status CheckPortsFree(const Topology& topology, const std::string& host = "");

}  // namespace lamina

#endif  // LAMINA_COMMON_TOPOLOGY_TOPOLOGY_H_
