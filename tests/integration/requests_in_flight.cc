#include "tests/integration/requests_in_flight.h"

#include "absl/time/clock.h"

namespace lamina::testing {
namespace {

// Streams `request` into `*o`, each piece under `mu` when given.
void StreamInto(cli::ClusterClient& client, const lamina::v1::GenerateRequest& request, std::mutex* mu, Outcome* o) {
  const absl::Status status = client.Generate(request, [&](const lamina::v1::GenerateResponse& r) {
    std::unique_lock<std::mutex> lock;
    if (mu != nullptr) lock = std::unique_lock<std::mutex>(*mu);
    o->ids.insert(o->ids.end(), r.token_ids().begin(), r.token_ids().end());
    o->logprobs.insert(o->logprobs.end(), r.logprobs().begin(), r.logprobs().end());
    o->text += r.text();
    if (r.finish_reason() != lamina::v1::FINISH_REASON_UNSPECIFIED) o->finish = r.finish_reason();
  });
  std::unique_lock<std::mutex> lock;
  if (mu != nullptr) lock = std::unique_lock<std::mutex>(*mu);
  o->status = status;
  o->ended = absl::Now();
}

}  // namespace

lamina::v1::GenerateRequest IdsRequest(const std::vector<int32_t>& ids, int max_tokens) {
  lamina::v1::GenerateRequest r;
  for (int32_t id : ids) r.mutable_token_ids()->add_ids(id);
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  return r;
}

Outcome Generate(cli::ClusterClient& client, const lamina::v1::GenerateRequest& request) {
  Outcome o;
  StreamInto(client, request, nullptr, &o);
  return o;
}

RequestsInFlight::RequestsInFlight(cli::ClusterClient& client,
                                   const std::vector<lamina::v1::GenerateRequest>& requests)
    : outcomes_(requests.size()), done_(requests.size(), false) {
  for (size_t i = 0; i < requests.size(); ++i) {
    threads_.emplace_back([this, &client, request = requests[i], i] {
      StreamInto(client, request, &mu_, &outcomes_[i]);
      std::lock_guard<std::mutex> lock(mu_);
      done_[i] = true;
    });
  }
}

RequestsInFlight::~RequestsInFlight() { Join(); }

bool RequestsInFlight::AwaitTokens(size_t tokens, absl::Duration most) {
  const absl::Time give_up = absl::Now() + most;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      bool all = true;
      for (size_t i = 0; i < outcomes_.size(); ++i) all = all && (done_[i] || outcomes_[i].ids.size() >= tokens);
      if (all) return true;
    }
    if (absl::Now() >= give_up) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

std::vector<Outcome> RequestsInFlight::Join() {
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  return outcomes_;
}

std::vector<Outcome> GenerateConcurrently(cli::ClusterClient& client,
                                          const std::vector<lamina::v1::GenerateRequest>& requests) {
  return RequestsInFlight(client, requests).Join();
}

}  // namespace lamina::testing
