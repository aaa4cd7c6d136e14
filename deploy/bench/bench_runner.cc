#include "deploy/bench/bench_runner.h"

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status/status_macros.h"
#include "deploy/bench/load_generator.h"

namespace lamina::bench {
namespace {

constexpr absl::Duration kCallTimeout = absl::Seconds(5);

// Reads the status until every node has reported after `since` (their load then covers the run),
// or gives up after a few seconds and uses the last reading.
absl::StatusOr<lamina::v1::ClusterStatusResponse> StatusAfter(cli::ClusterClient* client, absl::Time since) {
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  for (;;) {
    LAMINA_ASSIGN_OR_RETURN(lamina::v1::ClusterStatusResponse status, client->Status(kCallTimeout));
    bool fresh = true;
    for (const auto& node : status.nodes()) {
      if (node.healthy() && absl::Now() - absl::Milliseconds(node.last_heartbeat_ms()) <= since) fresh = false;
    }
    if (fresh || absl::Now() > give_up) return status;
    absl::SleepFor(absl::Milliseconds(100));
  }
}

}  // namespace

absl::StatusOr<BenchReport> RunBench(const BenchTarget& target, const WorkloadSpec& spec, const BenchOptions& options) {
  cli::ClusterClient* client = target.cluster;
  int vocab_size = target.vocab_size, max_context = target.max_context;
  lamina::v1::ClusterStatusResponse before;
  if (client != nullptr) {
    LAMINA_ASSIGN_OR_RETURN(lamina::v1::HealthResponse health, client->Health(absl::Seconds(10)));
    if (health.status() != lamina::v1::HealthResponse::SERVING) {
      return absl::FailedPreconditionError(
          absl::StrCat("the cluster at ", client->endpoint(), " is not serving: ", health.detail()));
    }
    LAMINA_ASSIGN_OR_RETURN(lamina::v1::ListModelsResponse models, client->ListModels(kCallTimeout));
    if (models.models_size() == 0) return absl::FailedPreconditionError("the cluster serves no model");
    vocab_size = models.models(0).vocab_size();
    max_context = models.models(0).max_context();
    LAMINA_ASSIGN_OR_RETURN(before, client->Status(kCallTimeout));
  }
  if (spec.prompts.empty() && vocab_size <= 0) {
    return absl::FailedPreconditionError(
        "the model's vocabulary size is unknown, so random prompt ids cannot be drawn (lamina bench: --vocab-size, "
        "or --prompts FILE)");
  }
  if (max_context <= 0) {
    return absl::FailedPreconditionError("the model's context length is unknown (lamina bench: --max-context)");
  }
  LAMINA_ASSIGN_OR_RETURN(std::vector<BenchRequest> requests, MakeRequests(spec, vocab_size, max_context));

  LoadProgress progress;
  std::vector<lamina::v1::ClusterStatusResponse> samples;
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  const bool tty = ::isatty(STDERR_FILENO);
  const std::string label = options.label.empty() ? "bench" : options.label;
  const absl::Time start = absl::Now();
  std::thread sampler([&] {
    int reported_quarters = 0;
    std::unique_lock<std::mutex> lock(mu);
    while (!done_cv.wait_for(lock, std::chrono::milliseconds(250), [&] { return done; })) {
      if (client != nullptr) {
        lock.unlock();
        absl::StatusOr<lamina::v1::ClusterStatusResponse> status = client->Status(absl::Seconds(1));
        lock.lock();
        if (status.ok()) samples.push_back(*std::move(status));
      }
      if (!options.show_progress) continue;
      const int finished = progress.finished.load();
      const std::string line = absl::StrCat(label, ": ", finished, "/", requests.size(), " requests, ",
                                            progress.output_tokens.load(), " tokens out, ", progress.failed.load(),
                                            " failed, ", absl::FormatDuration(absl::Trunc(absl::Now() - start,
                                                                                          absl::Milliseconds(100))));
      if (tty) {
        std::fprintf(stderr, "\r%s\033[K", line.c_str());
      } else if (absl::Now() - start > absl::Seconds(5) &&
                 finished * 4 / static_cast<int>(requests.size()) > reported_quarters) {
        // Off a terminal, only runs long enough to wonder about say how far they are.
        reported_quarters = finished * 4 / static_cast<int>(requests.size());
        std::fprintf(stderr, "%s\n", line.c_str());
      }
    }
  });
  std::vector<RequestRecord> records = RunLoad(target.sender, spec, requests, &progress);
  const absl::Time load_end = absl::Now();
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  done_cv.notify_all();
  sampler.join();
  if (options.show_progress && tty) std::fprintf(stderr, "\r\033[K");

  lamina::v1::ClusterStatusResponse after;
  if (client != nullptr) {
    LAMINA_ASSIGN_OR_RETURN(after, StatusAfter(client, load_end));
  }
  return MakeReport(spec, records, before, after, samples, options.hourly_usd);
}

}  // namespace lamina::bench
