// How a bench sends one request and hears its tokens: over Lamina's gRPC API (GrpcSender), or over
// OpenAI's HTTP API, Lamina's or any OpenAI-compatible server's (OpenAiSender, openai_sender.h).
// Every request asks for exactly its output length (end-of-sequence ignored).
// Implementations are thread-safe: a bench sends from many threads at once.
#ifndef LAMINA_DEPLOY_BENCH_REQUEST_SENDER_H_
#define LAMINA_DEPLOY_BENCH_REQUEST_SENDER_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "deploy/bench/workload.h"
#include "deploy/client/cluster_client.h"

namespace lamina::bench {

class RequestSender {
 public:
  virtual ~RequestSender() = default;
  // Sends `request` and waits for its end, at most `timeout` (DeadlineExceeded). `on_tokens(n)`
  // runs as n more output tokens arrive (n may be negative when the server's final count corrects
  // the running one). `*prompt_tokens` is set to the server's count of the prompt when it gives one.
  virtual absl::Status Send(const BenchRequest& request, absl::Duration timeout,
                            const std::function<void(int)>& on_tokens, int* prompt_tokens) = 0;
};

// Lamina's lamina.v1.Generation over gRPC.
class GrpcSender final : public RequestSender {
 public:
  explicit GrpcSender(cli::ClusterClient* client) : client_(client) {}
  absl::Status Send(const BenchRequest& request, absl::Duration timeout, const std::function<void(int)>& on_tokens,
                    int* prompt_tokens) override;

 private:
  cli::ClusterClient* client_;
};

}  // namespace lamina::bench

#endif  // LAMINA_DEPLOY_BENCH_REQUEST_SENDER_H_
