// lamina-bench-cluster: what disaggregation costs on one machine's CPUs, measured side by side.
//   1. The per-layer round trip of decode attention over the tcp data plane (RemoteAttention ->
//      loopback -> AttentionServer -> executor) against calling the same executor in process,
//      at several batch sizes, for the demo model's layer shape.
//   2. The tokens/s of real clusters (`lamina up`, separate processes) against single-process
//      mode on the same prompts: offloaded to two memory nodes, and with local attention.
//   3. Chunked prefill against whole prompts (`scheduler.chunked_prefill`), on clusters with a
//      small token budget: the gaps between the tokens of requests decoding while long prompts
//      arrive, the long prompts' time to first token, and the tokens/s of all.
// Usage: lamina-bench-cluster [--requests N] [--tokens N] [--prompt-tokens N] [--budget TOKENS]
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
#include "kv/attention/attention_executor.h"
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
  const AttentionWireShape shape{c.num_layers, c.q_size(), c.kv_size(), c.num_kv_heads};
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

// Tokens/s of `requests` sent at once to a cluster started with `options`; 0 when it fails.
double ClusterTokensPerSecond(const testing::ClusterOptions& options, const std::vector<GenerationRequest>& requests) {
  auto cluster = testing::ClusterHarness::Start(options);
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", std::string(cluster.status().message()).c_str());
    return 0;
  }
  std::vector<std::thread> threads;
  std::vector<int64_t> counts(requests.size(), 0);
  const auto start = Clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] {
      lamina::v1::GenerateRequest r;
      for (int32_t id : requests[i].prompt) r.mutable_token_ids()->add_ids(id);
      r.set_max_tokens(requests[i].max_tokens);
      r.set_ignore_eos(true);
      (*cluster)->client().Generate(r, [&](const lamina::v1::GenerateResponse& resp) { counts[i] += resp.token_ids_size(); }).IgnoreError();
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = Seconds(start);
  int64_t generated = 0;
  for (int64_t n : counts) generated += n;
  return generated / seconds;
}

// Single-process mode against clusters on the same prompts (`prompt_tokens` tokens each, or the
// demo's short sentences with 0): one compute node with two memory nodes, and one compute node
// attending in its own pool (local attention).
void Throughput(int num_requests, int tokens, int prompt_tokens) {
  auto local = LocalCluster::Load(testing::ModelDir("lamina-demo-6m"));
  if (!local.ok()) return;
  const std::vector<std::string> texts = {"Attention offloading", "The memory devices", "FlashAttention",
                                          "In this paper, we"};
  std::vector<GenerationRequest> requests(num_requests);
  for (int i = 0; i < num_requests; ++i) {
    if (prompt_tokens > 0) {
      for (int t = 0; t < prompt_tokens; ++t) {
        requests[i].prompt.push_back(static_cast<int32_t>((i * 7919 + t * 31 + 1) % (*local)->config().vocab_size));
      }
    } else {
      requests[i].prompt = (*local)->tokenizer().EncodePrompt(texts[i % texts.size()]);
    }
    requests[i].max_tokens = tokens;
    requests[i].ignore_eos = true;
  }
  auto start = Clock::now();
  int64_t generated = 0;
  if (!(*local)->Generate(requests, [&](const TokenEvent&) { ++generated; }).ok()) return;
  const double local_tps = generated / Seconds(start);
  local->reset();  // its threads would compete with the clusters'

  testing::ClusterOptions offloaded;
  testing::ClusterOptions own_pool;
  own_pool.memory_nodes = 0;
  own_pool.compute_kv_capacity_tokens = 2 * num_requests * (std::max(prompt_tokens, 16) + tokens);
  offloaded.kv_capacity_tokens = own_pool.compute_kv_capacity_tokens;
  const double offloaded_tps = ClusterTokensPerSecond(offloaded, requests);
  const double own_pool_tps = ClusterTokensPerSecond(own_pool, requests);
  std::printf("\n%d requests x %d tokens, prompts of %s, demo model\n", num_requests, tokens,
              prompt_tokens > 0 ? absl::StrCat(prompt_tokens, " tokens").c_str() : "a few words");
  std::printf("%-52s %10.0f tokens/s\n", "single process (in-process attention)", local_tps);
  std::printf("%-52s %10.0f tokens/s  (%.2fx single process)\n", "cluster: 1 compute + 2 memory processes",
              offloaded_tps, offloaded_tps / local_tps);
  std::printf("%-52s %10.0f tokens/s  (%.2fx single process)\n", "cluster: 1 compute process, local attention",
              own_pool_tps, own_pool_tps / local_tps);
}

// What one run of the mixed load came to.
struct MixedLoad {
  std::vector<double> gaps_ms;  // between consecutive tokens of the decoding requests
  std::vector<double> ttft_ms;  // of the long prompts
  double tokens_per_second = 0;
  bool ok = true;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

// `decoders` short prompts decoding 160 tokens each; from 50 ms on, one of `long_prompts` long
// prompts (8 tokens out) arrives every 60 ms.
MixedLoad RunMixedLoad(bool chunked, int budget, const std::vector<int32_t>& short_prompt,
                       const std::vector<int32_t>& long_prompt, int decoders, int long_prompts) {
  MixedLoad load;
  testing::ClusterOptions options;
  options.max_tokens_per_iteration = budget;
  options.chunked_prefill = chunked;
  options.prefix_caching = false;  // every long prompt prefilled in full
  auto cluster = testing::ClusterHarness::Start(options);
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", std::string(cluster.status().message()).c_str());
    load.ok = false;
    return load;
  }
  std::mutex mu;
  int64_t generated = 0;
  auto request = [](const std::vector<int32_t>& prompt, int tokens) {
    lamina::v1::GenerateRequest r;
    for (int32_t id : prompt) r.mutable_token_ids()->add_ids(id);
    r.set_max_tokens(tokens);
    r.set_ignore_eos(true);
    return r;
  };
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int i = 0; i < decoders; ++i) {
    threads.emplace_back([&] {
      std::vector<Clock::time_point> at;
      absl::Status s =
          (*cluster)->client().Generate(request(short_prompt, 160), [&](const lamina::v1::GenerateResponse& r) {
            for (int k = 0; k < r.token_ids_size(); ++k) at.push_back(Clock::now());
          });
      std::lock_guard<std::mutex> lock(mu);
      load.ok &= s.ok();
      generated += static_cast<int64_t>(at.size());
      for (size_t k = 1; k < at.size(); ++k) {
        load.gaps_ms.push_back(std::chrono::duration<double, std::milli>(at[k] - at[k - 1]).count());
      }
    });
  }
  for (int i = 0; i < long_prompts; ++i) {
    threads.emplace_back([&, i] {
      std::this_thread::sleep_until(start + std::chrono::milliseconds(50 + 60 * i));
      const auto sent = Clock::now();
      double ttft = -1;
      int64_t count = 0;
      absl::Status s =
          (*cluster)->client().Generate(request(long_prompt, 8), [&](const lamina::v1::GenerateResponse& r) {
            if (ttft < 0) ttft = std::chrono::duration<double, std::milli>(Clock::now() - sent).count();
            count += r.token_ids_size();
          });
      std::lock_guard<std::mutex> lock(mu);
      load.ok &= s.ok();
      generated += count;
      load.ttft_ms.push_back(ttft);
    });
  }
  for (auto& t : threads) t.join();
  load.tokens_per_second = generated / Seconds(start);
  return load;
}

void ChunkedPrefill(int budget) {
  auto local = LocalCluster::Load(testing::ModelDir("lamina-demo-6m"));
  if (!local.ok()) return;
  std::string text;
  while (text.size() < 3000) {
    text +=
        "Attention offloading moves the KV cache to cheap memory devices, which run attention, while the "
        "expensive compute devices run the rest of the model. ";
  }
  const std::vector<int32_t> long_prompt = (*local)->tokenizer().EncodePrompt(text);
  const std::vector<int32_t> short_prompt = (*local)->tokenizer().EncodePrompt("The memory devices");
  constexpr int kDecoders = 8, kLongPrompts = 6;
  std::printf(
      "\nchunked prefill: %d requests decoding 160 tokens each while %d prompts of %zu tokens arrive, one\n"
      "every 60 ms; scheduler.max_tokens_per_iteration %d; medians of 3 runs of each, alternating\n",
      kDecoders, kLongPrompts, long_prompt.size(), budget);
  std::vector<MixedLoad> runs[2];  // [0] whole prompts, [1] chunks
  for (int r = 0; r < 3; ++r) {
    for (int chunked : {0, 1}) {
      runs[chunked].push_back(RunMixedLoad(chunked == 1, budget, short_prompt, long_prompt, kDecoders, kLongPrompts));
      if (!runs[chunked].back().ok)
        std::fprintf(stderr, "a request failed in a %s run\n", chunked ? "chunked" : "whole");
    }
  }
  struct Row {
    const char* name;
    double (*of)(const MixedLoad&);
  };
  const Row rows[] = {
      {"decode gap p50 ms", [](const MixedLoad& l) { return Percentile(l.gaps_ms, 0.5); }},
      {"decode gap p99 ms", [](const MixedLoad& l) { return Percentile(l.gaps_ms, 0.99); }},
      {"decode gap max ms", [](const MixedLoad& l) { return Percentile(l.gaps_ms, 1.0); }},
      {"long prompt TTFT p50 ms", [](const MixedLoad& l) { return Percentile(l.ttft_ms, 0.5); }},
      {"tokens/s, all requests", [](const MixedLoad& l) { return l.tokens_per_second; }},
  };
  std::printf("%-26s %14s %14s %14s\n", "", "whole prompts", "chunks", "chunks/whole");
  for (const Row& row : rows) {
    double median[2];
    for (int k = 0; k < 2; ++k) {
      std::vector<double> v;
      for (const MixedLoad& l : runs[k]) v.push_back(row.of(l));
      median[k] = Percentile(v, 0.5);
    }
    std::printf("%-26s %14.1f %14.1f %14.2f\n", row.name, median[0], median[1], median[1] / median[0]);
  }
}

int Main(int argc, char** argv) {
  int requests = 16, tokens = 64, budget = 64, prompt_tokens = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--requests") == 0) requests = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--tokens") == 0) tokens = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--budget") == 0) budget = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--prompt-tokens") == 0) prompt_tokens = std::atoi(argv[i + 1]);
  }
  std::printf("lamina-bench-cluster; command: ");
  for (int i = 0; i < argc; ++i) std::printf("%s ", argv[i]);
  std::printf("\n\n");
  auto config = LoadModelConfig(testing::ModelDir("lamina-demo-6m"));
  if (!config.ok()) return 1;
  RoundTrips(*config);
  Throughput(requests, tokens, prompt_tokens);
  ChunkedPrefill(budget);
  return 0;
}

}  // namespace
}  // namespace lamina

int main(int argc, char** argv) { return lamina::Main(argc, argv); }
