#include "deploy/bench/load_generator.h"

#include <algorithm>
#include <thread>

#include "absl/time/clock.h"

namespace lamina::bench {
namespace {

lamina::v1::GenerateRequest ToProto(const BenchRequest& r) {
  lamina::v1::GenerateRequest request;
  if (!r.prompt_ids.empty()) {
    request.mutable_token_ids()->mutable_ids()->Add(r.prompt_ids.begin(), r.prompt_ids.end());
  } else {
    request.set_text(r.prompt_text);
  }
  request.set_max_tokens(r.output_tokens);
  request.set_ignore_eos(true);  // outputs run to their drawn length
  return request;
}

}  // namespace

std::vector<RequestRecord> RunLoad(cli::ClusterClient* client, const WorkloadSpec& spec,
                                   const std::vector<BenchRequest>& requests, LoadProgress* progress) {
  std::vector<RequestRecord> records(requests.size());
  const absl::Time start = absl::Now();
  const absl::Duration timeout = absl::Seconds(spec.request_timeout_s);
  auto since_start = [&] { return absl::ToDoubleSeconds(absl::Now() - start); };
  auto run_one = [&](size_t i) {
    RequestRecord& rec = records[i];
    rec.sent_s = since_start();
    rec.status = client->Generate(
        ToProto(requests[i]),
        [&](const lamina::v1::GenerateResponse& response) {
          if (response.token_ids_size() > 0 && rec.first_token_s < 0) rec.first_token_s = since_start();
          rec.output_tokens += response.token_ids_size();
          progress->output_tokens += response.token_ids_size();
          if (response.finish_reason() != lamina::v1::FINISH_REASON_UNSPECIFIED) {
            rec.prompt_tokens = response.prompt_tokens();
          }
        },
        timeout);
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
