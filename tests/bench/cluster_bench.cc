// lamina-bench-cluster: what disaggregation costs on one machine's CPUs, measured side by side.
//   1. The per-layer round trip of decode attention over the tcp data plane (RemoteAttention ->
//      loopback -> AttentionServer -> executor) against calling the same executor in process,
//      at several batch sizes, for the demo model's layer shape.
//   2. The tokens/s of a real cluster (`lamina up`, separate processes) against single-process
//      mode on the same prompts.
// Usage: lamina-bench-cluster [--requests N] [--tokens N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_config/model_config.h"
#include "compute_node/remote/remote_attention.h"
#include "coordinator/embedded/local_cluster.h"
#include "memory_node/attention/attention_executor.h"
#include "memory_node/data_plane/attention_server.h"
#include "tests/integration/cluster_harness.h"
#include "tests/support/golden.h"

namespace lamina {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// One layer's Decode for `batch` sequences of `context` tokens, through `service`.
struct LayerCall {
  AttentionService* service;
  std::vector<DecodeEntry> entries;
  std::vector<double> micros;
};

// Medians of in-process and over-tcp calls, measured alternately so that both see the same
// machine load.
std::pair<double, double> LayerMicros(AttentionService& direct, AttentionService& remote, const ModelConfig& c,
                                      int batch, int context, SequenceId first_direct, SequenceId first_remote) {
  std::vector<float> qkv(batch * c.qkv_size(), 0.01f), out(batch * c.q_size());
  const QkvLayout layout{c.qkv_size(), 0, c.q_size(), c.q_size() + c.kv_size()};
  LayerCall calls[2] = {{&direct, {}, {}}, {&remote, {}, {}}};
  const SequenceId firsts[2] = {first_direct, first_remote};
  for (int k = 0; k < 2; ++k) {
    std::vector<Reservation> reservations;
    for (int b = 0; b < batch; ++b) {
      reservations.push_back({firsts[k] + b, context + 1});
      calls[k].entries.push_back({firsts[k] + b, context});
    }
    if (!calls[k].service->Reserve(reservations).ok()) return {-1, -1};
  }
  for (int i = 0; i < 200; ++i) {
    for (LayerCall& call : calls) {
      auto start = Clock::now();
      if (!call.service->Decode(i % c.num_layers, call.entries, qkv.data(), layout, out.data(), c.q_size()).ok()) {
        return {-1, -1};
      }
      call.micros.push_back(Seconds(start) * 1e6);
    }
  }
  for (LayerCall& call : calls) {
    for (const DecodeEntry& e : call.entries) call.service->Free(e.seq);
    std::sort(call.micros.begin(), call.micros.end());
  }
  return {calls[0].micros[100], calls[1].micros[100]};
}

void RoundTrips(const ModelConfig& c) {
  const int context = 256;
  auto direct = AttentionExecutor::Create({c.num_layers, 200 * (context + 1), {c.num_q_heads, c.num_kv_heads, c.head_dim, 0}});
  auto served = AttentionExecutor::Create({c.num_layers, 200 * (context + 1), {c.num_q_heads, c.num_kv_heads, c.head_dim, 0}});
  std::unique_ptr<Transport> tcp = MakeTcpTransport();
  std::mutex mu;
  const AttentionWireShape shape{c.num_layers, c.q_size(), c.kv_size()};
  auto server = AttentionServer::Start(tcp.get(), "127.0.0.1:0", shape, served->get(), &mu);
  if (!direct.ok() || !served.ok() || !server.ok()) {
    std::fprintf(stderr, "set-up failed\n");
    return;
  }
  RemoteAttention remote(tcp.get(), {{"m", (*server)->address()}}, shape);
  std::printf("per-layer decode attention, context %d, demo layer (%lld q heads, %lld kv heads, head_dim %lld),\n",
              context, static_cast<long long>(c.num_q_heads), static_cast<long long>(c.num_kv_heads),
              static_cast<long long>(c.head_dim));
  std::printf("medians of 200 calls each, alternating\n");
  std::printf("%8s %14s %14s %14s %12s\n", "batch", "in-process us", "tcp us", "overhead us", "bytes/call");
  SequenceId seq = 0;
  for (int batch : {1, 8, 32, 128}) {
    for (int b = 0; b < batch; ++b) {
      if (!remote.Assign(seq + 100000 + b, "m").ok()) return;
    }
    auto [in_process, over_tcp] = LayerMicros(**direct, remote, c, batch, context, seq, seq + 100000);
    const int64_t bytes = batch * (c.qkv_size() + c.q_size()) * 4 + batch * 12;
    std::printf("%8d %14.1f %14.1f %14.1f %12lld\n", batch, in_process, over_tcp, over_tcp - in_process,
                static_cast<long long>(bytes));
    seq += batch;
  }
}

void Throughput(int num_requests, int tokens) {
  auto local = LocalCluster::Load(testing::ModelDir("lamina-demo-6m"));
  if (!local.ok()) return;
  const std::vector<std::string> texts = {"Attention offloading", "The memory devices", "FlashAttention",
                                          "In this paper, we"};
  std::vector<GenerationRequest> requests(num_requests);
  for (int i = 0; i < num_requests; ++i) {
    requests[i].prompt = (*local)->tokenizer().EncodePrompt(texts[i % texts.size()]);
    requests[i].max_tokens = tokens;
    requests[i].ignore_eos = true;
  }
  auto start = Clock::now();
  int64_t generated = 0;
  if (!(*local)->Generate(requests, [&](const TokenEvent&) { ++generated; }).ok()) return;
  const double local_tps = generated / Seconds(start);

  auto cluster = testing::ClusterHarness::Start({});
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", std::string(cluster.status().message()).c_str());
    return;
  }
  std::vector<std::thread> threads;
  std::vector<int64_t> counts(num_requests, 0);
  start = Clock::now();
  for (int i = 0; i < num_requests; ++i) {
    threads.emplace_back([&, i] {
      lamina::v1::GenerateRequest r;
      for (int32_t id : requests[i].prompt) r.mutable_token_ids()->add_ids(id);
      r.set_max_tokens(tokens);
      r.set_ignore_eos(true);
      (*cluster)->client().Generate(r, [&](const lamina::v1::GenerateResponse& resp) { counts[i] += resp.token_ids_size(); }).IgnoreError();
    });
  }
  for (auto& t : threads) t.join();
  const double cluster_seconds = Seconds(start);
  int64_t cluster_generated = 0;
  for (int64_t n : counts) cluster_generated += n;
  const double cluster_tps = cluster_generated / cluster_seconds;
  std::printf("\n%d requests x %d tokens, demo model\n", num_requests, tokens);
  std::printf("%-40s %10.0f tokens/s\n", "single process (in-process attention)", local_tps);
  std::printf("%-40s %10.0f tokens/s  (%.2fx single process)\n", "cluster: 1 compute + 2 memory processes", cluster_tps,
              cluster_tps / local_tps);
}

int Main(int argc, char** argv) {
  int requests = 16, tokens = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--requests") == 0) requests = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--tokens") == 0) tokens = std::atoi(argv[i + 1]);
  }
  std::printf("lamina-bench-cluster; command: ");
  for (int i = 0; i < argc; ++i) std::printf("%s ", argv[i]);
  std::printf("\n\n");
  auto config = LoadModelConfig(testing::ModelDir("lamina-demo-6m"));
  if (!config.ok()) return 1;
  RoundTrips(*config);
  Throughput(requests, tokens);
  return 0;
}

}  // namespace
}  // namespace lamina

int main(int argc, char** argv) { return lamina::Main(argc, argv); }
