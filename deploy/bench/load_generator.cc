#include "deploy/bench/load_generator.h"

#include <algorithm>
#include <thread>

#include "absl/time/clock.h"

namespace lamina::bench {

std::vector<RequestRecord> RunLoad(RequestSender* sender, const WorkloadSpec& spec,
                                   const std::vector<BenchRequest>& requests, LoadProgress* progress) {
  std::vector<RequestRecord> records(requests.size());
  const absl::Time start = absl::Now();
  const absl::Duration timeout = absl::Seconds(spec.request_timeout_s);
  auto since_start = [&] { return absl::ToDoubleSeconds(absl::Now() - start); };
  auto run_one = [&](size_t i) {
    RequestRecord& rec = records[i];
    rec.sent_s = since_start();
    rec.status = sender->Send(
        requests[i], timeout,
        [&](int tokens) {
          if (tokens > 0 && rec.first_token_s < 0) rec.first_token_s = since_start();
          rec.output_tokens += tokens;
          progress->output_tokens += tokens;
        },
        &rec.prompt_tokens);
    rec.done_s = since_start();
    if (!rec.status.ok()) ++progress->failed;
    ++progress->finished;
  };

  // Closed-loop workers share `next`; it outlives them, since they are joined below.
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  if (spec.mode == ArrivalMode::kClosedLoop) {
    const int workers = std::min<int>(spec.concurrency, static_cast<int>(requests.size()));
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&] {
        for (size_t i; (i = next++) < requests.size();) run_one(i);
      });
    }
  } else {
    for (size_t i = 0; i < requests.size(); ++i) {
      const absl::Time due = start + absl::Seconds(requests[i].arrival_s);
      if (due > absl::Now()) absl::SleepFor(due - absl::Now());
      threads.emplace_back(run_one, i);
    }
  }
  for (std::thread& t : threads) t.join();
  return records;
}

}  // namespace lamina::bench
