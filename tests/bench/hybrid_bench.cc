// lamina-bench-hybrid: what a memory node adds to a compute node whose own KV pool holds only half
// of the requests (issue 74's hybrid target), measured side by side in one run:
//   - alone: one compute node (`--device`) with its pool capped to half the requests' tokens;
//   - hybrid: the same, plus one memory node (`--memory-device`, a CPU by default) with room for
//     every request, under `scheduler.placement: balanced`.
// Both serve `--requests` concurrent greedy requests of `--prompt-tokens` prompt tokens and
// `--output-tokens` output tokens (EOS ignored) through the cluster's gRPC API. Each prints its
// output tokens/s (all requests' tokens over the time from the first request sent to the last one
// ended) and the most sequences running at once (from the cluster's status, polled), and the
// ratios hybrid / alone, which the target wants above 1 for both.
//   lamina-bench-hybrid [--model DIR] [--random-weights SEED] [--device cpu|cuda:N]
//                       [--memory-device cpu] [--requests 32] [--prompt-tokens 512]
//                       [--output-tokens 128]
// --random-weights: the model folder's shape with random weights (a config-only folder such as
// deploy/models/llama-3.1-8b-shape).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/model_config/model_config.h"
#include "common/status/status_macros.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/requests_in_flight.h"

namespace lamina::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string model = "lamina-demo-6m";
  std::optional<int64_t> random_weights;
  std::string device = "cpu";
  std::string memory_device = "cpu";
  int requests = 32;
  int prompt_tokens = 512;
  int output_tokens = 128;
};

struct Served {
  double tokens_per_second = 0;
  int64_t most_running = 0;
  int failed = 0;
};

// Sequences running on the cluster's pools now (what the prefix cache keeps left out).
int64_t Running(cli::ClusterClient& client) {
  absl::StatusOr<lamina::v1::ClusterStatusResponse> status = client.Status(absl::Seconds(1));
  if (!status.ok()) return 0;
  int64_t running = 0;
  for (const auto& node : status->nodes()) running += node.num_sequences() - node.cached_sequences();
  return running;
}

absl::StatusOr<Served> Serve(const Options& o, bool hybrid) {
  testing::ClusterOptions cluster;
  cluster.model = o.model;
  cluster.random_weights_seed = o.random_weights;
  cluster.device = o.device;
  cluster.max_batch = o.requests;
  cluster.prefix_caching = false;  // the prompts share a prefix: room, not the cache, is measured
  const int64_t per_request = o.prompt_tokens + o.output_tokens;
  cluster.compute_kv_capacity_tokens = per_request * ((o.requests + 1) / 2);
  cluster.memory_nodes = hybrid ? 1 : 0;
  if (hybrid) {
    cluster.memory_devices = {o.memory_device};
    cluster.kv_capacity_tokens = per_request * o.requests;
    cluster.placement = "balanced";
  }
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<testing::ClusterHarness> harness, testing::ClusterHarness::Start(cluster));

  std::vector<lamina::v1::GenerateRequest> requests;
  for (int r = 0; r < o.requests; ++r) {
    std::vector<int32_t> prompt(o.prompt_tokens);
    for (int t = 0; t < o.prompt_tokens; ++t) prompt[t] = 3 + (r * 131 + t * 7) % 997;  // any vocabulary of 1,000
    requests.push_back(testing::IdsRequest(prompt, o.output_tokens));
  }
  Served served;
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done) {
      served.most_running = std::max(served.most_running, Running(harness->client()));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  const Clock::time_point start = Clock::now();
  const std::vector<testing::Outcome> outcomes = testing::GenerateConcurrently(harness->client(), requests);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  done = true;
  watcher.join();
  int64_t tokens = 0;
  for (const testing::Outcome& outcome : outcomes) {
    if (!outcome.status.ok()) {
      ++served.failed;
      std::fprintf(stderr, "a request failed: %s\n", outcome.status.ToString().c_str());
    }
    tokens += static_cast<int64_t>(outcome.ids.size());
  }
  served.tokens_per_second = tokens / seconds;
  return served;
}

int Run(const Options& o) {
  std::printf("%d requests of %d prompt and %d output tokens; compute node on %s, its pool holding %d of "
              "them; hybrid: plus a memory node on %s (balanced placement)\n",
              o.requests, o.prompt_tokens, o.output_tokens, o.device.c_str(), (o.requests + 1) / 2,
              o.memory_device.c_str());
  absl::StatusOr<Served> alone = Serve(o, false);
  absl::StatusOr<Served> hybrid = alone.ok() ? Serve(o, true) : alone;
  if (!alone.ok() || !hybrid.ok()) {
    std::fprintf(stderr, "%s\n", (alone.ok() ? hybrid : alone).status().ToString().c_str());
    return 1;
  }
  std::printf("%-8s %12s %14s %8s\n", "", "tokens/s", "most running", "failed");
  std::printf("%-8s %12.1f %14lld %8d\n", "alone", alone->tokens_per_second,
              static_cast<long long>(alone->most_running), alone->failed);
  std::printf("%-8s %12.1f %14lld %8d\n", "hybrid", hybrid->tokens_per_second,
              static_cast<long long>(hybrid->most_running), hybrid->failed);
  std::printf("hybrid / alone: tokens/s %.2f, most running %.2f\n", hybrid->tokens_per_second / alone->tokens_per_second,
              static_cast<double>(hybrid->most_running) / std::max<int64_t>(1, alone->most_running));
  return alone->failed + hybrid->failed > 0 ? 1 : 0;
}

}  // namespace
}  // namespace lamina::bench

int main(int argc, char** argv) {
  lamina::bench::Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    int64_t number = 0;
    const bool numeric = absl::SimpleAtoi(value, &number);
    if (flag == "--model") o.model = value;
    else if (flag == "--device") o.device = value;
    else if (flag == "--memory-device") o.memory_device = value;
    else if (flag == "--random-weights" && numeric) o.random_weights = number;
    else if (flag == "--requests" && numeric && number > 0) o.requests = static_cast<int>(number);
    else if (flag == "--prompt-tokens" && numeric && number > 0) o.prompt_tokens = static_cast<int>(number);
    else if (flag == "--output-tokens" && numeric && number > 0) o.output_tokens = static_cast<int>(number);
    else {
      std::fprintf(stderr, "lamina-bench-hybrid: bad flag %s %s\n", flag.c_str(), value.c_str());
      return 2;
    }
  }
  return lamina::bench::Run(o);
}
