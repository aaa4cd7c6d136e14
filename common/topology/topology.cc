#include "common/topology/topology.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cuda/device.h"
#include "common/status/status_macros.h"
#include "common/topology/kv_dtype.h"
#include "common/yaml/yaml_fields.h"
#include "yaml-cpp/yaml.h"

namespace lamina {
namespace {

using Fields = YamlFields;

// A memory node's `transport`: one name or a list in order of preference, `auto` (the default)
// kept as written for TransportsBetween to resolve per compute node.
absl::StatusOr<std::vector<std::string>> ParseTransports(const Fields& f, const std::string& device) {
  const bool on_gpu = device != "cpu";
  std::vector<std::string> names;
  const YAML::Node field = f.Get("transport");
  if (!f.Has("transport")) {
    names = {"auto"};
  } else if (field.IsSequence()) {
    for (const YAML::Node& item : field) {
      if (!item.IsScalar()) return f.Error(item, "transport", "expected a transport name");
      names.push_back(item.Scalar());
    }
    if (names.empty()) return f.Error(field, "transport", "expected at least one transport");
  } else {
    const std::string none;
    LAMINA_ASSIGN_OR_RETURN(std::string name, f.String("transport", &none));
    names = {name};
  }
  for (const std::string& name : names) {
    if (name == "cuda_ipc" || name == "nccl" || name == "rdma") {
      if (!on_gpu) {
        return f.Error(field, "transport", absl::StrCat(name, " needs the memory node on a GPU (device: cpu)"));
      }
    } else if (name != "tcp" && name != "auto") {
      return f.Error(field, "transport",
                     absl::StrCat("unknown transport '", name, "' (available: tcp, cuda_ipc, nccl, rdma, auto)"));
    }
  }
  return names;
}

// A node's `kv_dtype` ("auto" by default), checked against its device.
absl::Status ParseKvDtype(const Fields& f, NodeSpec* spec) {
  const std::string default_kv_dtype = "auto";
  LAMINA_ASSIGN_OR_RETURN(spec->kv_dtype, f.String("kv_dtype", &default_kv_dtype));
  // The model's config only chooses what "auto" means, which is never refused.
  const absl::Status kv_dtype = ChooseKvDtype(spec->kv_dtype, ModelConfig{}, spec->device != "cpu").status();
  if (!kv_dtype.ok()) return f.Error(f.Get("kv_dtype"), "kv_dtype", std::string(kv_dtype.message()));
  return absl::OkStatus();
}

// A compute node's `tuning:` block, when it has one.
absl::StatusOr<DataPlaneTuning> ParseTuning(const Fields& node, const std::string& where) {
  DataPlaneTuning tuning;
  if (!node.Has("tuning")) return tuning;
  Fields f(node.Get("tuning"), node.path(), where + ".tuning", {"chunk_rows", "line_rows", "packet_rows"});
  LAMINA_RETURN_IF_ERROR(f.CheckShape());
  LAMINA_ASSIGN_OR_RETURN(tuning.chunk_rows, f.Integer("chunk_rows", &kDefaultChunkRows, 0, int64_t{1} << 20));
  LAMINA_ASSIGN_OR_RETURN(tuning.line_rows, f.Integer("line_rows", &kDefaultLineRows, 0, kMostLineRows));
  LAMINA_ASSIGN_OR_RETURN(tuning.packet_rows, f.Integer("packet_rows", &kDefaultPacketRows, 0, kDefaultPacketRows));
  return tuning;
}

absl::StatusOr<NodeSpec> ParseNode(const YAML::Node& node, const std::string& path, int index) {
  const std::string where = absl::StrCat("nodes[", index, "]");
  Fields f(node, path, where,
           {"name", "role", "host", "port", "data_port", "device", "transport", "kv_capacity_tokens", "threads", "kind",
            "gpu_busy_timing", "tuning", "kv_dtype", "layers", "tensor_parallel", "devices"});
  if (node.IsMap()) {
    for (const char* field : {"chunk_rows", "line_rows", "packet_rows"}) {
      if (f.Has(field)) return f.Error(f.Get(field), field, "a data-plane tuning field: write it under `tuning:`");
    }
  }
  LAMINA_RETURN_IF_ERROR(f.CheckShape());
  NodeSpec spec;
  spec.line = node.Mark().line + 1;
  LAMINA_ASSIGN_OR_RETURN(spec.name, f.String("name", nullptr));
  LAMINA_ASSIGN_OR_RETURN(std::string role, f.String("role", nullptr));
  if (role == "compute") {
    spec.kind = NodeKind::kCompute;
  } else if (role == "memory") {
    spec.kind = NodeKind::kMemory;
  } else {
    return f.Error(f.Get("role"), "role", absl::StrCat("expected 'compute' or 'memory', got '", role, "'"));
  }
  const std::string default_host = "127.0.0.1";
  LAMINA_ASSIGN_OR_RETURN(spec.host, f.String("host", &default_host));
  LAMINA_ASSIGN_OR_RETURN(int64_t port, f.Integer("port", nullptr, 1, 65535));
  spec.port = static_cast<int>(port);
  const std::string default_device = "cpu";
  LAMINA_ASSIGN_OR_RETURN(spec.device, f.String("device", &default_device));
  // Whether this host has that GPU is the node's to check when it starts.
  if (!ParseDevice(spec.device).ok()) {
    return f.Error(f.Get("device"), "device", absl::StrCat("expected 'cpu' or 'cuda:N', got '", spec.device, "'"));
  }
  const std::string default_kind = spec.device == "cpu" ? "cpu" : "";
  LAMINA_ASSIGN_OR_RETURN(spec.price_kind, f.String("kind", &default_kind));
  const int64_t zero = 0;
  LAMINA_ASSIGN_OR_RETURN(int64_t threads, f.Integer("threads", &zero, 0, 1024));
  spec.threads = static_cast<int>(threads);
  if (spec.kind == NodeKind::kMemory) {
    LAMINA_ASSIGN_OR_RETURN(int64_t data_port, f.Integer("data_port", nullptr, 1, 65535));
    spec.data_port = static_cast<int>(data_port);
    LAMINA_ASSIGN_OR_RETURN(spec.kv_capacity_tokens, f.Integer("kv_capacity_tokens", nullptr, 1, int64_t{1} << 40));
    LAMINA_ASSIGN_OR_RETURN(spec.transports, ParseTransports(f, spec.device));
    LAMINA_RETURN_IF_ERROR(ParseKvDtype(f, &spec));
    for (const char* field : {"gpu_busy_timing", "tuning", "layers", "tensor_parallel", "devices"}) {
      if (f.Has(field)) return f.Error(f.Get(field), field, "only compute nodes have this field");
    }
  } else {
    LAMINA_ASSIGN_OR_RETURN(spec.gpu_busy_timing, f.Bool("gpu_busy_timing", false));
    LAMINA_ASSIGN_OR_RETURN(spec.tuning, ParseTuning(f, where));
    // Compute nodes: where the previous replica hands batches over under rotational pipelining.
    LAMINA_ASSIGN_OR_RETURN(int64_t data_port, f.Integer("data_port", &zero, 1, 65535));
    spec.data_port = static_cast<int>(data_port);
    // A pool of its own (local attention), optional.
    LAMINA_ASSIGN_OR_RETURN(spec.kv_capacity_tokens, f.Integer("kv_capacity_tokens", &zero, 1, int64_t{1} << 40));
    if (f.Has("kv_dtype") && !f.Has("kv_capacity_tokens")) {
      return f.Error(f.Get("kv_dtype"), "kv_dtype", "a compute node's kv_dtype needs its kv_capacity_tokens");
    }
    LAMINA_RETURN_IF_ERROR(ParseKvDtype(f, &spec));
    if (f.Has("transport")) return f.Error(f.Get("transport"), "transport", "only memory nodes have this field");
    if (f.Has("layers")) {
      LAMINA_ASSIGN_OR_RETURN(std::vector<int64_t> layers, f.IntegerList("layers", 0, int64_t{1} << 20));
      if (layers.size() != 2 || layers[0] >= layers[1]) {
        return f.Error(f.Get("layers"), "layers", "expected [first, end): the node computes layers first .. end - 1");
      }
      spec.first_layer = layers[0];
      spec.end_layer = layers[1];
    }
    const int64_t one = 1;
    LAMINA_ASSIGN_OR_RETURN(int64_t tensor_parallel, f.Integer("tensor_parallel", &one, 1, 64));
    spec.tensor_parallel = static_cast<int>(tensor_parallel);
    if (f.Has("devices") && !f.Has("tensor_parallel")) {
      return f.Error(f.Get("devices"), "devices", "a device for each rank of `tensor_parallel` (use `device` otherwise)");
    }
  }
  return spec;
}

// A layer split's compute nodes keep their sequences' KV either all on memory nodes or each in a
// pool of its own holding its layers' share of every slot: one pool, named after the first node
// (NodeSpec::kv_pool), of the same size on every node, on the CPU so far.
absl::Status ShareLayerSplitPool(Topology* t) {
  const std::vector<const NodeSpec*> computes = t->NodesOf(NodeKind::kCompute);
  const NodeSpec* first = computes.front();
  for (const NodeSpec* node : computes) {
    if (node->kv_capacity_tokens == first->kv_capacity_tokens && node->kv_dtype == first->kv_dtype) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        t->path, ":", node->line, ": nodes '", node->name, "'.kv_capacity_tokens: a layer split's compute nodes hold "
        "one KV pool together, each its layers' share of every slot: give every one the same kv_capacity_tokens "
        "and kv_dtype (", first->name, " has ", first->kv_capacity_tokens, ", ", node->name, " ",
        node->kv_capacity_tokens, "), or none"));
  }
  if (first->kv_capacity_tokens == 0) return absl::OkStatus();
  for (NodeSpec& node : t->nodes) {
    if (node.kind != NodeKind::kCompute) continue;
    if (absl::StartsWith(node.device, "cuda")) {
      return absl::InvalidArgumentError(absl::StrCat(
          t->path, ":", node.line, ": nodes '", node.name, "'.kv_capacity_tokens: a layer split's own KV pool runs on "
          "the CPU so far; on ", node.device, " keep the KV caches on memory nodes"));
    }
    node.kv_pool = first->name;
  }
  return absl::OkStatus();
}

// A compute node entry's processes: itself, or its `tensor_parallel` ranks (topology.h).
absl::StatusOr<std::vector<NodeSpec>> ExpandRanks(const NodeSpec& spec, const YAML::Node& node,
                                                  const std::string& path, int index) {
  if (spec.tensor_parallel == 1) return std::vector<NodeSpec>{spec};
  Fields f(node, path, absl::StrCat("nodes[", index, "]"), {});
  std::vector<std::string> devices;
  if (f.Has("devices")) {
    const YAML::Node list = f.Get("devices");
    if (!list.IsSequence() || static_cast<int>(list.size()) != spec.tensor_parallel) {
      return f.Error(list, "devices", absl::StrCat("expected a list of ", spec.tensor_parallel, " devices, one a rank"));
    }
    for (const YAML::Node& item : list) {
      if (!item.IsScalar() || !ParseDevice(item.Scalar()).ok()) {
        return f.Error(item, "devices", "expected 'cpu' or 'cuda:N' for each rank");
      }
      devices.push_back(item.Scalar());
    }
  }
  if (spec.data_port == 0) {
    return f.Error(node, "data_port", "a tensor-parallel group's ranks exchange their partial sums over data_port + "
                                      "rank: give the entry one");
  }
  std::vector<NodeSpec> ranks;
  for (int r = 0; r < spec.tensor_parallel; ++r) {
    NodeSpec rank = spec;
    rank.tp_rank = r;
    rank.tp_group = spec.name;
    if (r > 0) rank.name = absl::StrCat(spec.name, "-rank", r);
    rank.port = spec.port + r;
    rank.data_port = spec.data_port + r;
    if (!devices.empty()) rank.device = devices[r];
    if (rank.port > 65535 || rank.data_port > 65535) {
      return f.Error(node, "port", absl::StrCat("rank ", r, "'s ports run past 65535"));
    }
    ranks.push_back(std::move(rank));
  }
  return ranks;
}

}  // namespace

const NodeSpec* Topology::Find(const std::string& name) const {
  for (const NodeSpec& node : nodes) {
    if (node.name == name) return &node;
  }
  return nullptr;
}

std::vector<const NodeSpec*> Topology::KvNodes() const {
  std::vector<const NodeSpec*> out;
  for (const NodeSpec& node : nodes) {
    if (node.holds_kv()) out.push_back(&node);
  }
  return out;
}

std::vector<const NodeSpec*> Topology::BatchComputeNodes() const {
  const std::vector<const NodeSpec*> computes = NodesOf(NodeKind::kCompute);
  // With no memory nodes every layer's attention runs on the compute node's own device: a second
  // batch there would only take turns with the first.
  if (pipelining == "auto" && computes.size() == 1 && NodesOf(NodeKind::kMemory).empty()) return {computes[0]};
  if (LayerSplit() && computes.size() > 1) {
    return std::vector<const NodeSpec*>(computes.size() + 1, computes[0]);  // slice 0 is the first node's
  }
  if (pipelining == "fixed" || (pipelining == "auto" && computes.size() > 1)) return computes;
  if (pipelining == "rotational" && computes.size() > 1) {
    std::vector<const NodeSpec*> first_slices;  // batch j starts on replica j mod R
    for (size_t j = 0; j <= computes.size(); ++j) first_slices.push_back(computes[j % computes.size()]);
    return first_slices;
  }
  if (pipelining == "rotational" || pipelining == "auto") return {computes[0], computes[0]};
  return {computes[0]};
}

int Topology::RotationReplicas() const {
  const int computes = static_cast<int>(NodesOf(NodeKind::kCompute).size());
  return (pipelining == "rotational" || LayerSplit()) && computes > 1 ? computes : 0;
}

bool Topology::LayerSplit() const {
  for (const NodeSpec& node : nodes) {
    if (node.splits_layers()) return true;
  }
  return false;
}

SliceRoute Topology::RouteOf(int batch, int replica) const {
  SliceRoute route{batch, replica, std::max(1, RotationReplicas()), {}};
  if (LayerSplit()) {
    for (const NodeSpec* node : NodesOf(NodeKind::kCompute)) route.first_layers.push_back(node->first_layer);
  }
  return route;
}

absl::Status CheckLayerSplit(const Topology& topology, int64_t num_layers) {
  if (!topology.LayerSplit()) return absl::OkStatus();
  int64_t next = 0;
  for (const NodeSpec* node : topology.NodesOf(NodeKind::kCompute)) {
    if (node->first_layer != next || node->end_layer > num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          topology.path, ":", node->line, ": nodes '", node->name, "'.layers: [", node->first_layer, ", ",
          node->end_layer, ") does not ", node->first_layer != next ? "start" : "fit",
          " where it must: the compute nodes, in topology order, split the model's ", num_layers,
          " layers from 0, each starting where the one before ended (here at ", next, ")"));
    }
    next = node->end_layer;
  }
  if (next != num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(topology.path, ": nodes: the compute nodes' layers end at ", next,
                                                   "; the model has ", num_layers, ": the last node's range must end there"));
  }
  return absl::OkStatus();
}

bool Topology::SecondBatchOnDemand() const {
  return pipelining == "auto" && NodesOf(NodeKind::kCompute).size() == 1 && !NodesOf(NodeKind::kMemory).empty();
}

int Topology::BatchesOn(const std::string& compute_node) const {
  if (RotationReplicas() > 0) return RotationReplicas() + 1;  // every batch visits every replica
  int count = 0;
  for (const NodeSpec* node : BatchComputeNodes()) count += node->name == compute_node ? 1 : 0;
  return count;
}

int64_t Topology::MostDecodeRows() const {
  return static_cast<int64_t>(max_batch) + max_tokens_per_iteration;
}

bool SameGpu(const NodeSpec& a, const NodeSpec& b) {
  if (a.host != b.host) return false;
  absl::StatusOr<DeviceSpec> da = ParseDevice(a.device), db = ParseDevice(b.device);
  return da.ok() && db.ok() && da->is_cuda && db->is_cuda && da->index == db->index;
}

std::vector<std::string> TransportsBetween(const NodeSpec& compute, const NodeSpec& memory) {
  const bool both_on_gpus = compute.device != "cpu" && memory.device != "cpu";
  const bool one_host = compute.host == memory.host;
  const bool one_gpu = SameGpu(compute, memory);
  std::vector<std::string> out;
  auto add = [&out](const std::string& t) {
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  };
  for (const std::string& t : memory.transports) {
    if (t == "auto") {
      if (both_on_gpus && one_host && !one_gpu) add("cuda_ipc");
      if (both_on_gpus && !one_gpu) add("nccl");
      add("tcp");
    } else if (t != "cuda_ipc" || one_host) {
      add(t);
    }
    if (!out.empty() && out.back() == "tcp") break;
  }
  return out;
}

std::vector<const NodeSpec*> Topology::NodesOf(NodeKind kind) const {
  std::vector<const NodeSpec*> out;
  for (const NodeSpec& node : nodes) {
    if (node.kind == kind && node.tp_rank == 0) out.push_back(&node);
  }
  return out;
}

std::vector<const NodeSpec*> Topology::PoolMembers(const std::string& pool) const {
  std::vector<const NodeSpec*> out;
  for (const NodeSpec& node : nodes) {
    if (node.kv_capacity_tokens > 0 && node.pool_name() == pool) out.push_back(&node);
  }
  return out;
}

std::vector<const NodeSpec*> Topology::RanksOf(const std::string& name) const {
  std::vector<const NodeSpec*> out;
  for (const NodeSpec& node : nodes) {
    if (node.name == name || (!node.tp_group.empty() && node.tp_group == name)) out.push_back(&node);
  }
  std::sort(out.begin(), out.end(), [](const NodeSpec* a, const NodeSpec* b) { return a->tp_rank < b->tp_rank; });
  return out;
}

absl::Status CheckTensorParallel(const Topology& topology, const ModelConfig& c) {
  for (const NodeSpec* node : topology.NodesOf(NodeKind::kCompute)) {
    const int n = node->tensor_parallel;
    if (n == 1) continue;
    const std::vector<std::pair<const char*, int64_t>> sizes = {
        {"num_attention_heads", c.num_q_heads},
        {"num_key_value_heads", c.num_kv_heads},
        {"intermediate_size", c.intermediate_size},
        {"vocab_size", c.tie_word_embeddings ? n : c.vocab_size}};
    for (const auto& [field, size] : sizes) {
      if (size % n != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            topology.path, ":", node->line, ": nodes '", node->name, "'.tensor_parallel: ", n,
            " ranks must divide the model's ", field, " (", size, ", config.json) evenly"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Topology> ParseTopology(const std::string& yaml_text, const std::string& path) {
  LAMINA_ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(yaml_text, path));
  Topology t;
  t.path = path;
  try {
    Fields top(root, path, "",
               {"model", "weights", "weights_seed", "coordinator", "scheduler", "pipelining", "nodes", "prices",
                "cluster_secret_file"});
    LAMINA_RETURN_IF_ERROR(top.CheckShape());

    LAMINA_ASSIGN_OR_RETURN(std::string model, top.String("model", nullptr));
    std::filesystem::path model_path(model);
    if (model_path.is_relative()) model_path = std::filesystem::path(path).parent_path() / model_path;
    t.model_dir = model_path.lexically_normal().string();
    if (!std::filesystem::exists(model_path / "config.json")) {
      return top.Error(top.Get("model"), "model",
                       absl::StrCat("'", model, "' (", t.model_dir, ") is not a model folder: no config.json"));
    }

    const std::string checkpoint = "checkpoint";
    LAMINA_ASSIGN_OR_RETURN(std::string weights, top.String("weights", &checkpoint));
    if (weights != "checkpoint" && weights != "random") {
      return top.Error(top.Get("weights"), "weights",
                       absl::StrCat("expected 'checkpoint' or 'random', got '", weights, "'"));
    }
    t.random_weights = weights == "random";
    const int64_t no_seed = 0;
    LAMINA_ASSIGN_OR_RETURN(t.weights_seed, top.Integer("weights_seed", &no_seed, 0, std::numeric_limits<int64_t>::max()));
    if (top.Has("weights_seed") && !t.random_weights) {
      return top.Error(top.Get("weights_seed"), "weights_seed", "only applies with 'weights: random'");
    }

    if (!top.Has("coordinator")) return absl::InvalidArgumentError(absl::StrCat(path, ":1: coordinator: missing"));
    Fields coordinator(top.Get("coordinator"), path, "coordinator",
                       {"host", "port", "http_port", "api_key_file", "open_probes", "tls"});
    LAMINA_RETURN_IF_ERROR(coordinator.CheckShape());
    const std::string default_host = "127.0.0.1";
    LAMINA_ASSIGN_OR_RETURN(t.coordinator_host, coordinator.String("host", &default_host));
    LAMINA_ASSIGN_OR_RETURN(int64_t port, coordinator.Integer("port", nullptr, 1, 65535));
    t.coordinator_port = static_cast<int>(port);
    const int64_t no_http = 0;
    LAMINA_ASSIGN_OR_RETURN(int64_t http_port, coordinator.Integer("http_port", &no_http, 1, 65535));
    if (http_port == port) {
      return coordinator.Error(coordinator.Get("http_port"), "http_port", "must differ from coordinator.port");
    }
    t.coordinator_http_port = static_cast<int>(http_port);
    // Files named in the topology are read relative to its folder, and must exist.
    auto resolve = [&](Fields& f, const std::string& field, std::string* out) -> absl::Status {
      const std::string none;
      LAMINA_ASSIGN_OR_RETURN(std::string value, f.String(field, &none));
      if (value.empty()) return absl::OkStatus();
      std::filesystem::path file(value);
      if (file.is_relative()) file = std::filesystem::path(path).parent_path() / file;
      *out = file.lexically_normal().string();
      if (!std::filesystem::exists(file)) return f.Error(f.Get(field), field, absl::StrCat("'", value, "' does not exist"));
      return absl::OkStatus();
    };
    LAMINA_RETURN_IF_ERROR(resolve(coordinator, "api_key_file", &t.api_key_file));
    LAMINA_ASSIGN_OR_RETURN(t.open_probes, coordinator.Bool("open_probes", true));
    if (coordinator.Has("tls")) {
      Fields tls(coordinator.Get("tls"), path, "coordinator.tls", {"cert", "key", "ca"});
      LAMINA_RETURN_IF_ERROR(tls.CheckShape());
      for (const char* required : {"cert", "key"}) {
        if (!tls.Has(required)) {
          return coordinator.Error(coordinator.Get("tls"), "tls", absl::StrCat("'", required, "' is missing"));
        }
      }
      LAMINA_RETURN_IF_ERROR(resolve(tls, "cert", &t.coordinator_tls.cert_file));
      LAMINA_RETURN_IF_ERROR(resolve(tls, "key", &t.coordinator_tls.key_file));
      LAMINA_RETURN_IF_ERROR(resolve(tls, "ca", &t.coordinator_tls.ca_file));
    }
    LAMINA_RETURN_IF_ERROR(resolve(top, "cluster_secret_file", &t.cluster_secret_file));

    if (top.Has("scheduler")) {
      Fields s(top.Get("scheduler"), path, "scheduler",
               {"max_batch", "max_tokens_per_iteration", "heartbeat_interval_ms", "heartbeat_timeout_ms",
                "prefix_caching", "step_timeout_ms", "rotational_above", "stagger", "chunked_prefill", "placement",
                "max_migrations", "shutdown_grace_s"});
      LAMINA_RETURN_IF_ERROR(s.CheckShape());
      const int64_t batch = t.max_batch, tokens = t.max_tokens_per_iteration, interval = t.heartbeat_interval_ms,
                    timeout = t.heartbeat_timeout_ms;
      LAMINA_ASSIGN_OR_RETURN(int64_t v1, s.Integer("max_batch", &batch, 1, 1 << 20));
      LAMINA_ASSIGN_OR_RETURN(int64_t v2, s.Integer("max_tokens_per_iteration", &tokens, 1, 1 << 24));
      LAMINA_ASSIGN_OR_RETURN(int64_t v3, s.Integer("heartbeat_interval_ms", &interval, 10, 60000));
      LAMINA_ASSIGN_OR_RETURN(int64_t v4, s.Integer("heartbeat_timeout_ms", &timeout, 20, 600000));
      t.max_batch = static_cast<int>(v1);
      t.max_tokens_per_iteration = static_cast<int>(v2);
      t.heartbeat_interval_ms = static_cast<int>(v3);
      t.heartbeat_timeout_ms = static_cast<int>(v4);
      LAMINA_ASSIGN_OR_RETURN(t.prefix_caching, s.Bool("prefix_caching", true));
      LAMINA_ASSIGN_OR_RETURN(t.stagger, s.Bool("stagger", false));
      LAMINA_ASSIGN_OR_RETURN(t.chunked_prefill, s.Bool("chunked_prefill", true));
      const int64_t step_timeout = t.step_timeout_ms;
      LAMINA_ASSIGN_OR_RETURN(int64_t v5, s.Integer("step_timeout_ms", &step_timeout, 100, 3600000));
      t.step_timeout_ms = static_cast<int>(v5);
      const int64_t rotational_above = t.rotational_above;
      LAMINA_ASSIGN_OR_RETURN(int64_t v6, s.Integer("rotational_above", &rotational_above, 0, 1 << 24));
      t.rotational_above = static_cast<int>(v6);
      const int64_t max_migrations = t.max_migrations, grace = t.shutdown_grace_s;
      LAMINA_ASSIGN_OR_RETURN(int64_t v7, s.Integer("max_migrations", &max_migrations, 0, 1000));
      LAMINA_ASSIGN_OR_RETURN(int64_t v8, s.Integer("shutdown_grace_s", &grace, 0, 86400));
      t.max_migrations = static_cast<int>(v7);
      t.shutdown_grace_s = static_cast<int>(v8);
      const std::string local_first = "local_first";
      LAMINA_ASSIGN_OR_RETURN(t.placement, s.String("placement", &local_first));
      if (t.placement != "local_first" && t.placement != "offload_first" && t.placement != "balanced") {
        return s.Error(s.Get("placement"), "placement",
                       absl::StrCat("expected 'local_first', 'offload_first' or 'balanced', got '", t.placement,
                                    "'"));
      }
      if (t.heartbeat_timeout_ms <= t.heartbeat_interval_ms) {
        return s.Error(s.Get("heartbeat_timeout_ms"), "heartbeat_timeout_ms", "must be longer than heartbeat_interval_ms");
      }
    }

    const std::string automatic = "auto";
    LAMINA_ASSIGN_OR_RETURN(t.pipelining, top.String("pipelining", &automatic));
    if (t.pipelining != "auto" && t.pipelining != "none" && t.pipelining != "fixed" && t.pipelining != "rotational") {
      return top.Error(top.Get("pipelining"), "pipelining",
                       absl::StrCat("expected 'auto', 'none', 'fixed' or 'rotational', got '", t.pipelining, "'"));
    }

    if (!top.Has("nodes") || !top.Get("nodes").IsSequence()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", root.Mark().line + 1, ": nodes: expected a list of nodes"));
    }
    std::set<std::string> names;
    std::map<std::string, int> endpoints;  // host:port -> line
    int index = 0;
    for (const YAML::Node& node : top.Get("nodes")) {
      LAMINA_ASSIGN_OR_RETURN(NodeSpec spec, ParseNode(node, path, index));
      if (!names.insert(spec.name).second) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", spec.line, ": nodes[", index, "].name: duplicate node name '",
                                                       spec.name, "'"));
      }
      LAMINA_ASSIGN_OR_RETURN(std::vector<NodeSpec> ranks, ExpandRanks(spec, node, path, index));
      for (const NodeSpec& rank : ranks) {
        if (rank.tp_rank > 0 && !names.insert(rank.name).second) {
          return absl::InvalidArgumentError(absl::StrCat(path, ":", spec.line, ": nodes[", index, "].name: rank ",
                                                         rank.tp_rank, "'s name '", rank.name, "' is taken"));
        }
        const std::string of_rank = rank.tp_rank > 0 ? absl::StrCat(" (rank ", rank.tp_rank, ")") : "";
        std::vector<std::pair<std::string, std::string>> ports = {{"port", rank.grpc_address()}};
        if (rank.data_port != 0) ports.push_back({"data_port", rank.data_address()});
        for (const auto& [field, address] : ports) {
          if (address == t.coordinator_address() || endpoints.count(address) ||
              (t.coordinator_http_port != 0 && address == t.coordinator_http_address())) {
            return absl::InvalidArgumentError(absl::StrCat(path, ":", spec.line, ": nodes[", index, "].", field, ": ",
                                                           address, of_rank, " is used twice in this topology"));
          }
          endpoints[address] = spec.line;
        }
        t.nodes.push_back(rank);
      }
      ++index;
    }
    const size_t computes = t.NodesOf(NodeKind::kCompute).size();
    if (computes == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": nodes: expected a compute node"));
    if (t.pipelining == "none" && computes != 1) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": nodes: ", computes, " compute nodes need 'pipelining: "
                                                     "fixed' or 'auto' (a batch each); 'none' runs one batch on one "
                                                     "compute node"));
    }
    for (const NodeSpec* node : t.NodesOf(NodeKind::kCompute)) {
      if (node->tensor_parallel == 1) continue;
      // What tensor-parallel groups run with so far: one batch each, their KV in a pool of their
      // own or on memory nodes, each rank attending its heads' share.
      const std::string group = absl::StrCat(path, ":", node->line, ": nodes '", node->name, "'.tensor_parallel: ");
      for (const NodeSpec* memory : t.NodesOf(NodeKind::kMemory)) {
        // A rank's share of the heads travels on the host path, to a pool that attends a window
        // of its heads: the CPU kernels over bfloat16 or float32.
        const std::string where = absl::StrCat(path, ":", memory->line, ": nodes '", memory->name, "'.");
        if (absl::StartsWith(memory->device, "cuda")) {
          return absl::InvalidArgumentError(absl::StrCat(where, "device: ", memory->device, ": memory nodes serving "
                                                         "tensor-parallel group '", node->name, "' run on the CPU "
                                                         "so far (each rank's heads travel on the host path)"));
        }
        if (memory->kv_dtype == "float8_e4m3") {
          return absl::InvalidArgumentError(absl::StrCat(where, "kv_dtype: float8_e4m3: a memory node serving "
                                                         "tensor-parallel group '", node->name, "' holds bfloat16 "
                                                         "or float32 (a float8 pool attends whole heads only)"));
        }
      }
      if (t.LayerSplit() || t.pipelining == "rotational") {
        return absl::InvalidArgumentError(absl::StrCat(group, "not with a layer split or rotational pipelining: a "
                                                       "group runs one batch of its own"));
      }
    }
    if (t.LayerSplit()) {
      for (const NodeSpec* node : t.NodesOf(NodeKind::kCompute)) {
        if (!node->splits_layers()) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ":", node->line, ": nodes '", node->name, "'.layers: missing; when one compute node splits the "
              "model's layers (`layers: [first, end)`), every compute node takes its share"));
        }
      }
      if (t.pipelining == "fixed" || t.pipelining == "none") {
        return top.Error(top.Get("pipelining"), "pipelining",
                         absl::StrCat("'", t.pipelining, "' cannot run a layer split: every batch passes through "
                                      "every compute node ('auto' or 'rotational')"));
      }
    }
    // How batches spread over the compute nodes, for messages.
    const std::string spread = absl::StrCat(t.LayerSplit() ? "a layer split" : "'rotational' pipelining", " over ",
                                            computes, " compute nodes");
    if (t.RotationReplicas() > 0) {
      for (const NodeSpec* node : t.NodesOf(NodeKind::kCompute)) {
        if (node->data_port == 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ":", node->line, ": nodes '", node->name, "'.data_port: ", spread,
              " hands each batch's residual stream from one to the next over this port; give every compute node one"));
        }
      }
    }
    if (t.NodesOf(NodeKind::kMemory).empty()) {
      for (const NodeSpec* node : t.NodesOf(NodeKind::kCompute)) {
        if (node->kv_capacity_tokens == 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ":", node->line, ": nodes '", node->name, "': no memory node holds its sequences' KV caches; "
              "give it a pool of its own (kv_capacity_tokens) or add a memory node"));
        }
      }
    }
    if (t.LayerSplit()) {
      LAMINA_RETURN_IF_ERROR(ShareLayerSplitPool(&t));
    } else if (t.RotationReplicas() > 0) {
      for (const NodeSpec* node : t.NodesOf(NodeKind::kCompute)) {
        if (node->holds_kv()) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ":", node->line, ": nodes '", node->name, "'.kv_capacity_tokens: ", spread,
              " runs each batch's layers on several of them in turn, so its KV caches live on memory nodes; a pool "
              "of the compute node's own cannot serve them"));
        }
      }
    }

    if (top.Has("prices")) {
      YAML::Node prices = top.Get("prices");
      if (!prices.IsMap()) return top.Error(prices, "prices", "expected a mapping of device kind to dollars per hour");
      for (const auto& entry : prices) {
        double value;
        if (!entry.second.IsScalar() || !absl::SimpleAtod(entry.second.Scalar(), &value) || value < 0) {
          return top.Error(entry.second, "prices." + entry.first.as<std::string>(), "expected a non-negative number");
        }
        t.prices[entry.first.as<std::string>()] = value;
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", e.mark.line + 1, ": ", e.msg));
  }
  return t;
}

absl::StatusOr<Topology> LoadTopology(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the topology file"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseTopology(buffer.str(), path);
}

absl::Status CheckPortsFree(const Topology& t, const std::string& host) {
  struct Use {
    std::string what;
    int line;
    int port;
  };
  std::vector<Use> uses;
  if (host.empty() || host == t.coordinator_host) {
    uses.push_back({"coordinator.port", 1, t.coordinator_port});
    if (t.coordinator_http_port != 0) uses.push_back({"coordinator.http_port", 1, t.coordinator_http_port});
  }
  for (const NodeSpec& n : t.nodes) {
    if (!host.empty() && n.host != host) continue;
    uses.push_back({"nodes '" + n.name + "' port", n.line, n.port});
    if (n.data_port != 0) uses.push_back({"nodes '" + n.name + "' data_port", n.line, n.data_port});
  }
  for (const Use& use : uses) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;  // as the real servers do, so that TIME_WAIT leftovers are not "in use"
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(use.port));
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    int ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::close(fd);
    if (ok != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(t.path, ":", use.line, ": ", use.what, ": port ", use.port, " is already in use on this machine"));
    }
  }
  return absl::OkStatus();
}

}  // namespace lamina
