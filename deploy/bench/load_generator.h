// Sends a workload's requests to a server and times each one: closed loop (a fixed number in
// flight, the next sent as one finishes) or open loop (each sent at its arrival time, however many
// are in flight). Every request has a deadline, so no run waits forever on a stuck cluster.
// Thread-safe: progress counters may be read while Run works.
#ifndef LAMINA_DEPLOY_BENCH_LOAD_GENERATOR_H_
#define LAMINA_DEPLOY_BENCH_LOAD_GENERATOR_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "deploy/bench/request_sender.h"
#include "deploy/bench/workload.h"

namespace lamina::bench {

// Seconds from the start of the run; first_token_s < 0 when no token came.
struct RequestRecord {
  double sent_s = 0;
  double first_token_s = -1;
  double done_s = 0;
  int prompt_tokens = 0;
  int output_tokens = 0;
  absl::Status status;
};

struct LoadProgress {
  std::atomic<int> finished{0};
  std::atomic<int> failed{0};
  std::atomic<int64_t> output_tokens{0};
};

// Runs every request; returns one record per request, in the order of `requests`.
std::vector<RequestRecord> RunLoad(RequestSender* sender, const WorkloadSpec& spec,
                                   const std::vector<BenchRequest>& requests, LoadProgress* progress);

}  // namespace lamina::bench

#endif  // LAMINA_DEPLOY_BENCH_LOAD_GENERATOR_H_
