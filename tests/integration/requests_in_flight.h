// Requests to a running cluster (ClusterHarness) for the integration tests: a request for given
// token ids, what a streamed generation came to, and several generations in flight at once, each
// on its own thread, whose progress a test can wait on (to act mid-run, such as killing a node)
// before it joins them.
#ifndef LAMINA_TESTS_INTEGRATION_REQUESTS_IN_FLIGHT_H_
#define LAMINA_TESTS_INTEGRATION_REQUESTS_IN_FLIGHT_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "deploy/client/cluster_client.h"
#include "lamina/v1/generation.pb.h"

namespace lamina::testing {

// `max_tokens` tokens after `ids`, with the API's default sampling (greedy), not stopped by EOS.
lamina::v1::GenerateRequest IdsRequest(const std::vector<int32_t>& ids, int max_tokens);

// What one streamed generation came to.
struct Outcome {
  absl::Status status;
  std::vector<int32_t> ids;
  std::vector<lamina::v1::TokenLogprobs> logprobs;  // when the request asked
  std::string text;
  lamina::v1::FinishReason finish = lamina::v1::FINISH_REASON_UNSPECIFIED;
  absl::Time ended;  // when the call returned
};

// One generation, to its end.
Outcome Generate(cli::ClusterClient& client, const lamina::v1::GenerateRequest& request);

// Every request at once, each on its own thread, from construction until Join (or destruction).
// Thread-compatible.
class RequestsInFlight {
 public:
  RequestsInFlight(cli::ClusterClient& client, const std::vector<lamina::v1::GenerateRequest>& requests);
  ~RequestsInFlight();
  RequestsInFlight(const RequestsInFlight&) = delete;
  RequestsInFlight& operator=(const RequestsInFlight&) = delete;

  // Waits, at most `most`, until every request has streamed `tokens` tokens or ended; whether
  // they all did.
  bool AwaitTokens(size_t tokens, absl::Duration most);
  // Waits for every request to end; the outcomes in request order.
  std::vector<Outcome> Join();

 private:
  std::mutex mu_;  // guards outcomes_ while the threads run
  std::vector<Outcome> outcomes_;
  std::vector<bool> done_;
  std::vector<std::thread> threads_;
};

// The requests in flight at once, to their ends; the outcomes in request order.
std::vector<Outcome> GenerateConcurrently(cli::ClusterClient& client,
                                          const std::vector<lamina::v1::GenerateRequest>& requests);

}  // namespace lamina::testing

#endif  // LAMINA_TESTS_INTEGRATION_REQUESTS_IN_FLIGHT_H_
