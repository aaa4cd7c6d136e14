#include "coordinator/scheduler/serving_metrics.h"

#include <vector>

namespace lamina {
namespace {

// Seconds, from half a millisecond (a GPU step's share of a token) to two minutes (a long queue).
std::vector<double> LatencyBounds() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
          0.15,   0.2,   0.3,    0.5,   0.75,   1,    2.5,   5,    10,   30,   60,    120};
}

// Seconds a whole request takes, up to an hour.
std::vector<double> RequestBounds() {
  return {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200, 3600};
}

// Tokens, up to the longest contexts.
std::vector<double> TokenBounds() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000};
}

}  // namespace

ServingMetrics::Snapshot::Snapshot()
    : queue_time(LatencyBounds()),
      time_to_first_token(LatencyBounds()),
      inter_token_latency(LatencyBounds()),
      request_latency(RequestBounds()),
      request_prompt_tokens(TokenBounds()),
      request_generation_tokens(TokenBounds()) {}

void ServingMetrics::Admitted(absl::Duration waited, int64_t prompt, int64_t cached) {
  std::lock_guard<std::mutex> lock(mu_);
  now_.queue_time.Observe(absl::ToDoubleSeconds(waited));
  now_.prompt_tokens += prompt;
  now_.cached_prompt_tokens += cached;
}

void ServingMetrics::Token(std::optional<absl::Duration> first, std::optional<absl::Duration> gap) {
  std::lock_guard<std::mutex> lock(mu_);
  ++now_.generated_tokens;
  if (first) now_.time_to_first_token.Observe(absl::ToDoubleSeconds(*first));
  if (gap) now_.inter_token_latency.Observe(absl::ToDoubleSeconds(*gap));
}

void ServingMetrics::SampleFinished(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++now_.samples[reason];
}

void ServingMetrics::RequestEnded(absl::StatusCode code, absl::Duration since_submitted, int64_t prompt,
                                  int64_t generated) {
  std::lock_guard<std::mutex> lock(mu_);
  ++now_.requests[absl::StatusCodeToString(code)];
  now_.request_latency.Observe(absl::ToDoubleSeconds(since_submitted));
  now_.request_prompt_tokens.Observe(static_cast<double>(prompt));
  now_.request_generation_tokens.Observe(static_cast<double>(generated));
}

void ServingMetrics::Refused(absl::StatusCode code) {
  std::lock_guard<std::mutex> lock(mu_);
  ++now_.requests[absl::StatusCodeToString(code)];
}

ServingMetrics::Snapshot ServingMetrics::Read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return now_;
}

void ServingMetrics::Migration(bool moved) {
  std::lock_guard<std::mutex> lock(mu_);
  ++(moved ? now_.migrations : now_.migrations_refused);
}

}  // namespace lamina
