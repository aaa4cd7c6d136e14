#include "common/topology/topology.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace lamina {
namespace {

const std::string kPath = std::string(LAMINA_SOURCE_DIR) + "/deploy/topologies/local-cpu.yaml";

std::string Original() { return testing::ReadFileOrDie(kPath); }

// `topology` with `line` added to compute-0, the node before memory-0.
std::string WithComputeLine(const std::string& topology, const std::string& line) {
  return absl::StrReplaceAll(topology, {{"    device: cpu\n\n  - name: memory-0",
                                         "    device: cpu\n    " + line + "\n\n  - name: memory-0"}});
}

// The demo topology without compute-0's own pool.
std::string WithoutComputePool() {
  return absl::StrReplaceAll(Original(), {{"    kv_capacity_tokens: 8192\n    device: cpu\n\n  - name: memory-0",
                                           "    device: cpu\n\n  - name: memory-0"}});
}

absl::Status Parse(const std::string& text) { return ParseTopology(text, kPath).status(); }

TEST(TopologyTest, TheDemoTopologyLoads) {
  auto t = LoadTopology(kPath);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->coordinator_address(), "127.0.0.1:50151");
  EXPECT_EQ(t->coordinator_http_address(), "127.0.0.1:50150");
  EXPECT_EQ(t->NodesOf(NodeKind::kCompute).size(), 1u);
  ASSERT_EQ(t->NodesOf(NodeKind::kMemory).size(), 2u);
  EXPECT_EQ(t->Find("memory-1")->data_address(), "127.0.0.1:50182");
  EXPECT_EQ(t->Find("memory-1")->kv_capacity_tokens, 8192);
  EXPECT_EQ(t->Find("memory-1")->line, 32);
  EXPECT_NE(t->model_dir.find("deploy/models/lamina-demo-6m"), std::string::npos);
  EXPECT_EQ(t->prices.at("cpu"), 0.05);
}

void ExpectError(const std::string& text, const std::string& expected) {
  absl::Status status = Parse(text);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << expected;
  EXPECT_NE(status.message().find(expected), std::string::npos) << status << "\nexpected: " << expected;
}

TEST(TopologyTest, ErrorsNameTheLineAndTheField) {
  const std::string original = Original();
  ExpectError(absl::StrReplaceAll(original, {{"    kv_capacity_tokens: 8192\n\n  - name: memory-1",
                                              "    kv_capacity_tokens: 8192\n    colour: blue\n\n  - name: memory-1"}}),
              "local-cpu.yaml:31: nodes[1].colour: unknown field");
  ExpectError(absl::StrReplaceAll(original, {{"port: 50171", "port: lots"}}),
              "local-cpu.yaml:27: nodes[1].port: expected an integer from 1 to 65535, got 'lots'");
  ExpectError(absl::StrReplaceAll(original, {{"name: memory-1", "name: memory-0"}}),
              "local-cpu.yaml:32: nodes[2].name: duplicate node name 'memory-0'");
  ExpectError(absl::StrReplaceAll(original, {{"data_port: 50182", "data_port: 50172"}}),
              "local-cpu.yaml:32: nodes[2].data_port: 127.0.0.1:50172 is used twice");
  ExpectError(absl::StrReplaceAll(original, {{"model: ../models/lamina-demo-6m", "model: ../models/nope"}}),
              "local-cpu.yaml:3: model: '../models/nope'");
  ExpectError(absl::StrReplaceAll(original, {{"role: memory\n    host: 127.0.0.1\n    port: 50181",
                                              "role: storage\n    host: 127.0.0.1\n    port: 50181"}}),
              "local-cpu.yaml:33: nodes[2].role: expected 'compute' or 'memory', got 'storage'");
  ExpectError(absl::StrReplaceAll(original, {{"max_batch: 64", "max_batch: [1, 2]"}}),
              "local-cpu.yaml:11: scheduler.max_batch: expected an integer");
  ExpectError(absl::StrReplaceAll(original, {{"pipelining: none", "pipelining: sideways"}}),
              "local-cpu.yaml:14: pipelining: expected 'auto', 'none', 'fixed' or 'rotational', got 'sideways'");
  ExpectError(absl::StrReplaceAll(original, {{"    device: cpu\n\n  - name: memory-0", "    device: gpu0\n\n  - name: memory-0"}}),
              "nodes[0].device: expected 'cpu' or 'cuda:N', got 'gpu0'");
  ExpectError("nodes: [\n", "local-cpu.yaml:2: not valid YAML");
  ExpectError(absl::StrReplaceAll(original, {{"  port: 50151", "  port: 50151\n  extra: 1"}}),
              "local-cpu.yaml:8: coordinator.extra: unknown field");
  ExpectError(absl::StrReplaceAll(original, {{"http_port: 50150", "http_port: 50151"}}),
              "local-cpu.yaml:8: coordinator.http_port: must differ from coordinator.port");
  ExpectError(absl::StrReplaceAll(original, {{"http_port: 50150", "http_port: 50161"}}),
              "local-cpu.yaml:17: nodes[0].port: 127.0.0.1:50161 is used twice in this topology");
  ExpectError(absl::StrReplaceAll(original, {{"http_port: 50150", "http_port: 0"}}),
              "local-cpu.yaml:8: coordinator.http_port: expected an integer from 1 to 65535, got '0'");
}

TEST(TopologyTest, StaggeringStepsIsASchedulerChoiceOffByDefault) {
  const std::string original = Original();
  auto plain = ParseTopology(original, kPath);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->stagger);
  auto staggered =
      ParseTopology(absl::StrReplaceAll(original, {{"  max_batch: 64\n", "  max_batch: 64\n  stagger: true\n"}}), kPath);
  ASSERT_TRUE(staggered.ok()) << staggered.status();
  EXPECT_TRUE(staggered->stagger);
  ExpectError(absl::StrReplaceAll(original, {{"  max_batch: 64\n", "  max_batch: 64\n  stagger: sometimes\n"}}),
              "local-cpu.yaml:12: scheduler.stagger");
}

TEST(TopologyTest, ChunkedPrefillIsASchedulerChoiceOnByDefault) {
  const std::string original = Original();
  auto plain = ParseTopology(original, kPath);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->chunked_prefill);
  auto whole = ParseTopology(
      absl::StrReplaceAll(original, {{"  max_batch: 64\n", "  max_batch: 64\n  chunked_prefill: false\n"}}), kPath);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_FALSE(whole->chunked_prefill);
  ExpectError(absl::StrReplaceAll(original, {{"  max_batch: 64\n", "  max_batch: 64\n  chunked_prefill: 12\n"}}),
              "local-cpu.yaml:12: scheduler.chunked_prefill");
}

TEST(TopologyTest, GpuBusyTimingIsAComputeNodeChoiceOffByDefault) {
  const std::string original = Original();
  auto plain = ParseTopology(original, kPath);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->Find("compute-0")->gpu_busy_timing);
  auto timed = ParseTopology(
      absl::StrReplaceAll(original, {{"    device: cpu\n\n  - name: memory-0",
                                      "    device: cpu\n    gpu_busy_timing: true\n\n  - name: memory-0"}}),
      kPath);
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_TRUE(timed->Find("compute-0")->gpu_busy_timing);
  ExpectError(absl::StrReplaceAll(original, {{"    kv_capacity_tokens: 8192\n\n  - name: memory-1",
                                              "    kv_capacity_tokens: 8192\n    gpu_busy_timing: true\n\n"
                                              "  - name: memory-1"}}),
              "nodes[1].gpu_busy_timing: only compute nodes have this field");
}

TEST(TopologyTest, DataPlaneTuningIsAComputeNodesOptionalBlock) {
  const std::string original = Original();
  auto plain = ParseTopology(original, kPath);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const DataPlaneTuning defaults = plain->Find("compute-0")->tuning;
  EXPECT_EQ(defaults.chunk_rows, kDefaultChunkRows);
  EXPECT_EQ(defaults.line_rows, kDefaultLineRows);
  EXPECT_EQ(defaults.packet_rows, kDefaultPacketRows);
  auto with = [&](const std::string& fields) { return WithComputeLine(original, "tuning:\n" + fields); };
  auto tuned = ParseTopology(with("      chunk_rows: 0\n      line_rows: 32\n      packet_rows: 256"), kPath);
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  EXPECT_EQ(tuned->Find("compute-0")->tuning.chunk_rows, 0);
  EXPECT_EQ(tuned->Find("compute-0")->tuning.line_rows, 32);
  EXPECT_EQ(tuned->Find("compute-0")->tuning.packet_rows, 256);
  auto partly = ParseTopology(with("      line_rows: 0"), kPath);  // the rest keep their defaults
  ASSERT_TRUE(partly.ok()) << partly.status();
  EXPECT_EQ(partly->Find("compute-0")->tuning.line_rows, 0);
  EXPECT_EQ(partly->Find("compute-0")->tuning.chunk_rows, kDefaultChunkRows);
  ExpectError(with("      chunk_rows: -1"), "nodes[0].tuning.chunk_rows");
  ExpectError(with("      line_rows: 33"), "nodes[0].tuning.line_rows");  // more than one launch receives
  ExpectError(with("      packet_rows: lots"), "nodes[0].tuning.packet_rows");
  ExpectError(with("      rows: 4"), "nodes[0].tuning.rows: unknown field");
  // Where they once were, they are named with where they go now.
  ExpectError(WithComputeLine(original, "chunk_rows: 64"),
              "nodes[0].chunk_rows: a data-plane tuning field: write it under `tuning:`");
  ExpectError(absl::StrReplaceAll(original, {{"    kv_capacity_tokens: 8192\n\n  - name: memory-1",
                                              "    kv_capacity_tokens: 8192\n    tuning:\n      chunk_rows: 64\n\n"
                                              "  - name: memory-1"}}),
              "nodes[1].tuning: only compute nodes have this field");
}

TEST(TopologyTest, TransportsAreAListInOrderOfPreference) {
  const std::string original = Original();
  // memory-1, nodes[2], with its device and transport replaced.
  auto with = [&](const std::string& device, const std::string& transport) {
    return absl::StrReplaceAll(original, {{"    data_port: 50182\n    device: cpu\n",
                                           "    data_port: 50182\n    device: " + device + "\n" + transport}});
  };
  auto transports = [&](const std::string& text) -> std::vector<std::string> {
    auto t = ParseTopology(text, kPath);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? t->Find("memory-1")->transports : std::vector<std::string>{};
  };
  EXPECT_EQ(transports(with("cpu", "")), (std::vector<std::string>{"auto"}));
  EXPECT_EQ(transports(with("cuda:1", "")), (std::vector<std::string>{"auto"}));
  EXPECT_EQ(transports(with("cuda:1", "    transport: [nccl, auto]\n")), (std::vector<std::string>{"nccl", "auto"}));
  EXPECT_EQ(transports(with("cuda:1", "    transport: cuda_ipc\n")), (std::vector<std::string>{"cuda_ipc"}));
  EXPECT_EQ(transports(with("cuda:1", "    transport: [tcp, cuda_ipc]\n")),
            (std::vector<std::string>{"tcp", "cuda_ipc"}));
  ExpectError(with("cpu", "    transport: cuda_ipc\n"), "nodes[2].transport: cuda_ipc needs the memory node on a GPU");
  ExpectError(with("cuda:1", "    transport: [cuda_ipc, pigeon]\n"), "nodes[2].transport: unknown transport 'pigeon'");
  EXPECT_EQ(transports(with("cuda:1", "    transport: [nccl, tcp]\n")), (std::vector<std::string>{"nccl", "tcp"}));
  ExpectError(with("cpu", "    transport: [nccl]\n"), "nodes[2].transport: nccl needs the memory node on a GPU");
  EXPECT_EQ(transports(with("cuda:1", "    transport: [rdma, nccl]\n")), (std::vector<std::string>{"rdma", "nccl"}));
  ExpectError(with("cpu", "    transport: rdma\n"), "nodes[2].transport: rdma needs the memory node on a GPU");
}

// `auto` resolves for each pair of nodes: cuda_ipc between GPUs of one host, nccl between GPUs,
// then tcp; only tcp for two nodes of one GPU. Transports named outright stay, but cuda_ipc
// across hosts.
TEST(TopologyTest, AutoResolvesPerPairOfNodesAndNamedTransportsStay) {
  NodeSpec compute;
  compute.device = "cuda:0";
  auto between = [&](const std::string& host, const std::string& device, std::vector<std::string> written) {
    NodeSpec memory;
    memory.kind = NodeKind::kMemory;
    memory.host = host;
    memory.device = device;
    memory.transports = std::move(written);
    return TransportsBetween(compute, memory);
  };
  using List = std::vector<std::string>;
  const std::string here = compute.host, there = "10.0.0.2";
  EXPECT_EQ(between(here, "cuda:1", {"auto"}), (List{"cuda_ipc", "nccl", "tcp"}));
  EXPECT_EQ(between(here, "cuda:0", {"auto"}), (List{"tcp"}));
  EXPECT_EQ(between(there, "cuda:0", {"auto"}), (List{"nccl", "tcp"}));
  EXPECT_EQ(between(here, "cpu", {"auto"}), (List{"tcp"}));
  EXPECT_EQ(between(here, "cuda:0", {"cuda_ipc", "tcp"}), (List{"cuda_ipc", "tcp"}));
  EXPECT_EQ(between(here, "cuda:0", {"nccl"}), (List{"nccl"}));
  EXPECT_EQ(between(there, "cuda:1", {"cuda_ipc", "tcp"}), (List{"tcp"}));
  EXPECT_EQ(between(here, "cuda:1", {"nccl", "auto"}), (List{"nccl", "cuda_ipc", "tcp"}));
  EXPECT_EQ(between(here, "cuda:1", {"rdma", "tcp", "auto"}), (List{"rdma", "tcp"}));  // nothing after tcp
  compute.device = "cpu";
  EXPECT_EQ(between(here, "cuda:1", {"auto"}), (List{"tcp"}));
  EXPECT_FALSE(SameGpu(compute, compute));  // the CPU is no GPU
  compute.device = "cuda:1";
  EXPECT_TRUE(SameGpu(compute, compute));
}

TEST(TopologyTest, RandomWeightsTakeASeedAndOtherwiseTheCheckpointIsRead) {
  const std::string original = Original();
  auto checkpoint = ParseTopology(original, kPath);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_FALSE(checkpoint->random_weights);

  const std::string model_line = "model: ../models/lamina-demo-6m\n";
  auto random = ParseTopology(
      absl::StrReplaceAll(original, {{model_line, model_line + "weights: random\nweights_seed: 42\n"}}), kPath);
  ASSERT_TRUE(random.ok()) << random.status();
  EXPECT_TRUE(random->random_weights);
  EXPECT_EQ(random->weights_seed, 42);

  ExpectError(absl::StrReplaceAll(original, {{model_line, model_line + "weights: zeros\n"}}),
              "local-cpu.yaml:4: weights: expected 'checkpoint' or 'random', got 'zeros'");
  ExpectError(absl::StrReplaceAll(original, {{model_line, model_line + "weights_seed: 3\n"}}),
              "local-cpu.yaml:4: weights_seed: only applies with 'weights: random'");
  ExpectError(absl::StrReplaceAll(original, {{model_line, model_line + "weights: random\nweights_seed: -1\n"}}),
              "local-cpu.yaml:5: weights_seed: expected an integer from 0");
}

// Compute nodes size their device links by it: a step's decodes, and prompts continuing on the
// decode path a row a token within the token budget.
TEST(TopologyTest, ADecodeStepSendsItsDecodesAndABudgetOfContinuingPromptTokensAtMost) {
  auto t = LoadTopology(kPath);
  ASSERT_TRUE(t.ok()) << t.status();
  t->max_batch = 256;
  t->max_tokens_per_iteration = 8192;
  EXPECT_EQ(t->MostDecodeRows(), 8448);
}

TEST(TopologyTest, PipeliningPlacesItsBatchesOnComputeNodes) {
  const std::string original = WithoutComputePool();  // rotation over two compute nodes refuses pools
  auto none = ParseTopology(original, kPath);
  ASSERT_TRUE(none.ok()) << none.status();
  ASSERT_EQ(none->BatchComputeNodes().size(), 1u);
  EXPECT_EQ(none->BatchesOn("compute-0"), 1);

  auto rotational = ParseTopology(absl::StrReplaceAll(original, {{"pipelining: none", "pipelining: rotational"}}), kPath);
  ASSERT_TRUE(rotational.ok()) << rotational.status();
  ASSERT_EQ(rotational->BatchComputeNodes().size(), 2u);
  EXPECT_EQ(rotational->BatchComputeNodes()[1]->name, "compute-0");
  EXPECT_EQ(rotational->BatchesOn("compute-0"), 2);

  const std::string second_compute =
      "nodes:\n  - name: compute-1\n    role: compute\n    host: 127.0.0.1\n    port: 50165\n    device: cpu\n\n";
  const std::string two_computes = absl::StrReplaceAll(original, {{"nodes:\n", second_compute}});
  auto fixed = ParseTopology(absl::StrReplaceAll(two_computes, {{"pipelining: none", "pipelining: fixed"}}), kPath);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  ASSERT_EQ(fixed->BatchComputeNodes().size(), 2u);
  EXPECT_EQ(fixed->BatchComputeNodes()[0]->name, "compute-1");
  EXPECT_EQ(fixed->BatchComputeNodes()[1]->name, "compute-0");
  EXPECT_EQ(fixed->BatchesOn("compute-0"), 1);

  // `auto`, the default: fixed over several compute nodes; on one, a second batch on demand.
  auto automatic = ParseTopology(absl::StrReplaceAll(original, {{"pipelining: none\n", ""}}), kPath);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->pipelining, "auto");
  EXPECT_EQ(automatic->BatchesOn("compute-0"), 2);
  EXPECT_TRUE(automatic->SecondBatchOnDemand());
  EXPECT_EQ(automatic->rotational_above, 80);
  auto automatic_fixed = ParseTopology(absl::StrReplaceAll(two_computes, {{"pipelining: none\n", ""}}), kPath);
  ASSERT_TRUE(automatic_fixed.ok()) << automatic_fixed.status();
  EXPECT_EQ(automatic_fixed->BatchComputeNodes().size(), 2u);
  EXPECT_FALSE(automatic_fixed->SecondBatchOnDemand());
  EXPECT_FALSE(fixed->SecondBatchOnDemand());

  ExpectError(two_computes, "2 compute nodes need 'pipelining: fixed'");
  // Rotational over two compute nodes: three batches, each through both nodes, handed over on
  // the compute nodes' data ports.
  const std::string rotating = absl::StrReplaceAll(two_computes, {{"pipelining: none", "pipelining: rotational"}});
  ExpectError(rotating, "nodes 'compute-1'.data_port: 'rotational' pipelining over 2 compute nodes hands each "
                        "batch's residual stream");
  const std::string with_ports = absl::StrReplaceAll(
      rotating, {{"port: 50165\n", "port: 50165\n    data_port: 50166\n"},
                 {"    role: compute\n    host: 127.0.0.1\n    port: 50161\n",
                  "    role: compute\n    host: 127.0.0.1\n    port: 50161\n    data_port: 50167\n"}});
  auto rotating_over_two = ParseTopology(with_ports, kPath);
  ASSERT_TRUE(rotating_over_two.ok()) << rotating_over_two.status() << "\n" << with_ports;
  EXPECT_EQ(rotating_over_two->RotationReplicas(), 2);
  ASSERT_EQ(rotating_over_two->BatchComputeNodes().size(), 3u);
  EXPECT_EQ(rotating_over_two->BatchComputeNodes()[0]->name, "compute-1");  // batch j starts on node j mod 2
  EXPECT_EQ(rotating_over_two->BatchComputeNodes()[1]->name, "compute-0");
  EXPECT_EQ(rotating_over_two->BatchComputeNodes()[2]->name, "compute-1");
  EXPECT_EQ(rotating_over_two->BatchesOn("compute-0"), 3);
  EXPECT_EQ(rotating_over_two->BatchesOn("compute-1"), 3);
  EXPECT_EQ(fixed->RotationReplicas(), 0);
  EXPECT_EQ(rotational->RotationReplicas(), 0);  // one compute node: two batches alternate on it
  ExpectError(absl::StrReplaceAll(with_ports, {{"data_port: 50166", "data_port: 50165"}}),
              "nodes[0].data_port: 127.0.0.1:50165 is used twice in this topology");
}

// The demo topology with compute-0 given `pool_lines` instead of its pool and the memory nodes
// taken away.
std::string ComputeNodeAlone(const std::string& pool_lines) {
  const std::string with_pool = WithComputeLine(WithoutComputePool(), pool_lines);
  return with_pool.substr(0, with_pool.find("  - name: memory-0")) + "prices:\n  cpu: 0.05\n";
}

TEST(TopologyTest, AComputeNodeMayHoldAPoolOfItsOwnAndThenNeedsNoMemoryNode) {
  auto alone = ParseTopology(ComputeNodeAlone("kv_capacity_tokens: 4096"), kPath);
  ASSERT_TRUE(alone.ok()) << alone.status();
  const NodeSpec* compute = alone->Find("compute-0");
  EXPECT_TRUE(compute->holds_kv());
  EXPECT_EQ(compute->kv_capacity_tokens, 4096);
  EXPECT_EQ(compute->kv_dtype, "auto");
  ASSERT_EQ(alone->KvNodes().size(), 1u);
  EXPECT_EQ(alone->KvNodes()[0]->name, "compute-0");
  EXPECT_EQ(alone->placement, "local_first");
  // `auto` runs one batch: with every layer's attention on the compute node's own device, a
  // second batch would only take turns with the first.
  auto automatic = ParseTopology(absl::StrReplaceAll(ComputeNodeAlone("kv_capacity_tokens: 4096"),
                                                     {{"pipelining: none\n", ""}}),
                                 kPath);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->BatchesOn("compute-0"), 1);
  EXPECT_FALSE(automatic->SecondBatchOnDemand());

  auto bf16 = ParseTopology(ComputeNodeAlone("kv_capacity_tokens: 4096\n    kv_dtype: bfloat16"), kPath);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->Find("compute-0")->kv_dtype, "bfloat16");

  // Beside memory nodes (the demo): all three hold KV caches.
  auto hybrid = ParseTopology(Original(), kPath);
  ASSERT_TRUE(hybrid.ok()) << hybrid.status();
  EXPECT_EQ(hybrid->KvNodes().size(), 3u);
  EXPECT_EQ(hybrid->Find("compute-0")->kv_capacity_tokens, 8192);
  EXPECT_FALSE(ParseTopology(WithoutComputePool(), kPath)->Find("compute-0")->holds_kv());

  ExpectError(ComputeNodeAlone("threads: 2"),
              "nodes 'compute-0': no memory node holds its sequences' KV caches; give it a pool of its own "
              "(kv_capacity_tokens) or add a memory node");
  ExpectError(ComputeNodeAlone("kv_dtype: bfloat16"),
              "nodes[0].kv_dtype: a compute node's kv_dtype needs its kv_capacity_tokens");
  ExpectError(ComputeNodeAlone("kv_capacity_tokens: 4096\n    kv_dtype: fp4"), "nodes[0].kv_dtype: expected auto");
  ExpectError(ComputeNodeAlone("kv_capacity_tokens: 0"), "nodes[0].kv_capacity_tokens: expected an integer from 1");
  ExpectError(ComputeNodeAlone("transport: tcp"), "nodes[0].transport: only memory nodes have this field");
}

TEST(TopologyTest, AKeyGivenTwiceIsRefusedWithBothLines) {
  ExpectError(absl::StrReplaceAll(Original(), {{"  max_batch: 64\n", "  max_batch: 64\n  max_batch: 8\n"}}),
              "local-cpu.yaml:12: scheduler.max_batch: given twice (first on line 11)");
  ExpectError(absl::StrReplaceAll(Original(), {{"    port: 50171\n", "    port: 50171\n    port: 50179\n"}}),
              "nodes[1].port: given twice");
}

TEST(TopologyTest, PlacementIsASchedulerChoiceLocalFirstByDefault) {
  const std::string hybrid = Original();
  auto offload = ParseTopology(
      absl::StrReplaceAll(hybrid, {{"  max_batch: 64\n", "  max_batch: 64\n  placement: offload_first\n"}}), kPath);
  ASSERT_TRUE(offload.ok()) << offload.status();
  EXPECT_EQ(offload->placement, "offload_first");
  auto balanced = ParseTopology(
      absl::StrReplaceAll(hybrid, {{"  max_batch: 64\n", "  max_batch: 64\n  placement: balanced\n"}}), kPath);
  ASSERT_TRUE(balanced.ok()) << balanced.status();
  EXPECT_EQ(balanced->placement, "balanced");
  ExpectError(absl::StrReplaceAll(hybrid, {{"  max_batch: 64\n", "  max_batch: 64\n  placement: anywhere\n"}}),
              "scheduler.placement: expected 'local_first', 'offload_first' or 'balanced', got 'anywhere'");
}

TEST(TopologyTest, RotationOverSeveralComputeNodesKeepsKvOnMemoryNodes) {
  // Each batch's layers run on every compute node in turn: a pool of one of them cannot serve it.
  const std::string second_compute =
      "nodes:\n  - name: compute-1\n    role: compute\n    host: 127.0.0.1\n    port: 50165\n    data_port: 50166\n"
      "    device: cpu\n\n";
  const std::string rotating = absl::StrReplaceAll(
      WithComputeLine(Original(), "data_port: 50167"),
      {{"nodes:\n", second_compute}, {"pipelining: none", "pipelining: rotational"}});
  ExpectError(rotating, "nodes 'compute-0'.kv_capacity_tokens: 'rotational' pipelining over 2 compute nodes");
}

TEST(TopologyTest, ALayerSplitCoversTheModelsLayersOnceInTopologyOrder) {
  const std::string first =
      "nodes:\n  - name: compute-1\n    role: compute\n    host: 127.0.0.1\n    port: 50165\n    data_port: 50166\n"
      "    device: cpu\n    layers: [0, 3]\n\n";
  const std::string split =
      absl::StrReplaceAll(WithComputeLine(WithoutComputePool(), "data_port: 50167\n    layers: [3, 6]"),
                          {{"nodes:\n", first}, {"pipelining: none", "pipelining: auto"}});
  auto topology = ParseTopology(split, kPath);
  ASSERT_TRUE(topology.ok()) << topology.status() << "\n" << split;
  EXPECT_TRUE(topology->LayerSplit());
  EXPECT_EQ(topology->RotationReplicas(), 2);
  // Three batches in flight, each starting on the first node (slice 0 is its).
  ASSERT_EQ(topology->BatchComputeNodes().size(), 3u);
  for (const NodeSpec* node : topology->BatchComputeNodes()) EXPECT_EQ(node->name, "compute-1");
  EXPECT_EQ(topology->BatchesOn("compute-0"), 3);
  const SliceRoute route = topology->RouteOf(2, 1);
  EXPECT_EQ(route.first_layers, (std::vector<int64_t>{0, 3}));
  EXPECT_TRUE(route.Owns(6));  // the last slice, with the head, on the node of the last layers
  EXPECT_TRUE(CheckLayerSplit(*topology, 6).ok());

  // Checked against the model's layers when its config is read (the coordinator and the nodes).
  const absl::Status short_of = CheckLayerSplit(*topology, 8);
  EXPECT_NE(short_of.message().find("the compute nodes' layers end at 6; the model has 8"), std::string::npos)
      << short_of;
  auto gap = ParseTopology(absl::StrReplaceAll(split, {{"layers: [3, 6]", "layers: [4, 6]"}}), kPath);
  ASSERT_TRUE(gap.ok()) << gap.status();
  const absl::Status gapped = CheckLayerSplit(*gap, 6);
  EXPECT_EQ(gapped.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gapped.message().find("nodes 'compute-0'.layers: [4, 6) does not start where it must"), std::string::npos)
      << gapped;
  EXPECT_NE(gapped.message().find("(here at 3)"), std::string::npos) << gapped;
  const absl::Status beyond = CheckLayerSplit(*topology, 5);
  EXPECT_NE(beyond.message().find("nodes 'compute-0'.layers: [3, 6) does not fit"), std::string::npos) << beyond;

  ExpectError(absl::StrReplaceAll(split, {{"    layers: [0, 3]\n", ""}}), "nodes 'compute-1'.layers: missing");
  ExpectError(absl::StrReplaceAll(split, {{"pipelining: auto", "pipelining: fixed"}}),
              "pipelining: 'fixed' cannot run a layer split");
  ExpectError(absl::StrReplaceAll(split, {{"layers: [3, 6]", "layers: [3, 3]"}}), "layers: expected [first, end)");
  ExpectError(absl::StrReplaceAll(split, {{"kv_capacity_tokens: 8192\n\n  - name: memory-1",
                                           "kv_capacity_tokens: 8192\n    layers: [0, 1]\n\n  - name: memory-1"}}),
              "layers: only compute nodes have this field");
  // The split's own pool: every node holds its layers' share of the same slots, one pool named
  // after the first node, whose frees and forks reach every node.
  ExpectError(absl::StrReplaceAll(split, {{"layers: [3, 6]", "layers: [3, 6]\n    kv_capacity_tokens: 64"}}),
              "nodes 'compute-0'.kv_capacity_tokens: a layer split's compute nodes hold one KV pool together");
  auto pooled = ParseTopology(
      absl::StrReplaceAll(split, {{"layers: [3, 6]", "layers: [3, 6]\n    kv_capacity_tokens: 64"},
                                  {"layers: [0, 3]", "layers: [0, 3]\n    kv_capacity_tokens: 64"}}),
      kPath);
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  std::vector<std::string> pools;
  for (const NodeSpec* node : pooled->KvNodes()) pools.push_back(node->name);
  EXPECT_EQ(pools, (std::vector<std::string>{"compute-1", "memory-0", "memory-1"}));
  const std::vector<const NodeSpec*> members = pooled->PoolMembers("compute-1");
  ASSERT_EQ(members.size(), 2u);
  EXPECT_EQ(members[1]->name, "compute-0");
  EXPECT_EQ(members[1]->pool_name(), "compute-1");
  ExpectError(absl::StrReplaceAll(split, {{"layers: [3, 6]", "layers: [3, 6]\n    kv_capacity_tokens: 64"},
                                          {"device: cpu\n    layers: [0, 3]",
                                           "device: cuda:0\n    layers: [0, 3]\n    kv_capacity_tokens: 64"}}),
              "nodes 'compute-1'.kv_capacity_tokens: a layer split's own KV pool runs on the CPU so far");
}

TEST(TopologyTest, ATensorParallelEntryRunsAsOneProcessPerRank) {
  const std::string yaml =
      "model: ../models/lamina-demo-6m\ncoordinator:\n  port: 50151\nnodes:\n"
      "  - name: compute-0\n    role: compute\n    port: 50161\n    data_port: 50165\n    kv_capacity_tokens: 4096\n"
      "    tensor_parallel: 4\n";
  auto topology = ParseTopology(yaml, kPath);
  ASSERT_TRUE(topology.ok()) << topology.status();
  ASSERT_EQ(topology->nodes.size(), 4u);
  // One compute node (its group), one batch, one KV pool; four processes.
  ASSERT_EQ(topology->NodesOf(NodeKind::kCompute).size(), 1u);
  EXPECT_EQ(topology->BatchComputeNodes().size(), 1u);
  ASSERT_EQ(topology->KvNodes().size(), 1u);
  EXPECT_EQ(topology->KvNodes()[0]->name, "compute-0");
  const std::vector<const NodeSpec*> ranks = topology->RanksOf("compute-0");
  ASSERT_EQ(ranks.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ranks[r]->name, r == 0 ? "compute-0" : absl::StrCat("compute-0-rank", r));
    EXPECT_EQ(ranks[r]->tp_rank, r);
    EXPECT_EQ(ranks[r]->tp_group, "compute-0");
    EXPECT_EQ(ranks[r]->port, 50161 + r);
    EXPECT_EQ(ranks[r]->data_port, 50165 + r);
    EXPECT_EQ(ranks[r]->holds_kv(), r == 0) << "the group's pool is rank 0's in the accounting";
  }
  EXPECT_EQ(topology->RanksOf("compute-0-rank2").size(), 1u);

  // The model's sizes must divide: the demo model has 8 query and 4 KV heads, MLP 688, vocabulary 1024.
  ModelConfig demo;
  demo.num_q_heads = 8;
  demo.num_kv_heads = 4;
  demo.intermediate_size = 688;
  demo.vocab_size = 1024;
  EXPECT_TRUE(CheckTensorParallel(*topology, demo).ok());
  demo.num_kv_heads = 2;
  const absl::Status kv = CheckTensorParallel(*topology, demo);
  EXPECT_EQ(kv.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(kv.message().find("nodes 'compute-0'.tensor_parallel: 4 ranks must divide the model's "
                              "num_key_value_heads (2, config.json) evenly"),
            std::string::npos)
      << kv;
  demo.num_kv_heads = 4;
  demo.vocab_size = 1022;
  EXPECT_NE(CheckTensorParallel(*topology, demo).message().find("vocab_size (1022"), std::string::npos);

  auto with_devices = ParseTopology(
      absl::StrReplaceAll(yaml, {{"tensor_parallel: 4\n", "tensor_parallel: 2\n    devices: [cpu, cpu]\n"}}), kPath);
  ASSERT_TRUE(with_devices.ok()) << with_devices.status();
  EXPECT_EQ(with_devices->nodes.size(), 2u);

  ExpectError(absl::StrReplaceAll(yaml, {{"tensor_parallel: 4\n", "tensor_parallel: 2\n    devices: [cpu]\n"}}),
              "devices: expected a list of 2 devices, one a rank");
  ExpectError(absl::StrReplaceAll(yaml, {{"    data_port: 50165\n", ""}}), "data_port: a tensor-parallel group's ranks");
  ExpectError(absl::StrReplaceAll(yaml, {{"    kv_capacity_tokens: 4096\n", ""}}),
              "give it a pool of its own (kv_capacity_tokens) or add a memory node");
  ExpectError(absl::StrReplaceAll(yaml, {{"coordinator:\n  port: 50151\n", "coordinator:\n  port: 50163\n"}}),
              "nodes[0].port: 127.0.0.1:50163 (rank 2) is used twice");
  // Memory nodes serve the group, each rank sending its own heads, on the CPU in bfloat16 or float32.
  const std::string memory = "  - name: memory-0\n    role: memory\n    port: 50171\n    data_port: 50172\n"
                             "    kv_capacity_tokens: 64\n";
  auto offloaded = ParseTopology(absl::StrReplaceAll(yaml, {{"    kv_capacity_tokens: 4096\n", ""}}) + memory, kPath);
  ASSERT_TRUE(offloaded.ok()) << offloaded.status();
  EXPECT_EQ(offloaded->KvNodes().size(), 1u);
  ExpectError(yaml + memory + "    kv_dtype: float8_e4m3\n",
              "nodes 'memory-0'.kv_dtype: float8_e4m3: a memory node serving tensor-parallel group 'compute-0' "
              "holds bfloat16 or float32");
  ExpectError(yaml + memory + "    device: cuda:0\n", "nodes 'memory-0'.device: cuda:0: memory nodes serving");
  ExpectError(absl::StrReplaceAll(yaml, {{"tensor_parallel: 4", "tensor_parallel: 0"}}), "tensor_parallel");
}

TEST(TopologyTest, EveryBundledTopologyLoads) {
  int loaded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(LAMINA_SOURCE_DIR) + "/deploy/topologies")) {
    if (entry.path().extension() != ".yaml") continue;
    auto t = LoadTopology(entry.path().string());
    EXPECT_TRUE(t.ok()) << t.status();
    ++loaded;
  }
  EXPECT_GT(loaded, 5);
}

TEST(TopologyTest, PortInUseIsReportedWithItsLine) {
  auto t = LoadTopology(kPath);
  ASSERT_TRUE(t.ok()) << t.status();
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  // Every other port 0 (always free to bind), so that a demo port some other connection holds on
  // this machine (an ephemeral one, say) cannot be reported first.
  t->coordinator_port = t->coordinator_http_port = 0;
  for (NodeSpec& node : t->nodes) node.port = node.data_port = 0;
  t->nodes[2].data_port = ntohs(addr.sin_port);
  absl::Status status = CheckPortsFree(*t);
  ::close(fd);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("local-cpu.yaml:32: nodes 'memory-1' data_port: port " +
                                  std::to_string(t->nodes[2].data_port) + " is already in use"),
            std::string::npos)
      << status;
}

}  // namespace
}  // namespace lamina
