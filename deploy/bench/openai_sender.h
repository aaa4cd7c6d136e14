// A bench's requests over OpenAI's HTTP API: POST /v1/completions, streamed, with the usage at the
// end, to Lamina's coordinator (its `http_port`) or to any OpenAI-compatible server (vLLM, SGLang,
// TGI), so that one workload can be measured on each. Requests carry vLLM's `ignore_eos`, which
// such servers take, so that outputs run to their drawn length.
// Thread-safe: every request has a connection of its own.
#ifndef LAMINA_DEPLOY_BENCH_OPENAI_SENDER_H_
#define LAMINA_DEPLOY_BENCH_OPENAI_SENDER_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/http/http_client.h"
#include "deploy/bench/request_sender.h"

namespace lamina::bench {

// "http://host:port", "https://host:port", either with "/" or "/v1" after it (an OpenAI SDK's base
// URL), or "host:port" (http); InvalidArgument for a missing port or another path.
struct OpenAiUrl {
  std::string address;  // host:port
  bool https = false;
};
absl::StatusOr<OpenAiUrl> ParseOpenAiUrl(const std::string& url);

// The server's first model (GET /v1/models) and its context, vLLM's `max_model_len` (0 when the
// server does not say).
struct OpenAiModel {
  std::string id;
  int max_context = 0;
};

// Requests carry `options`' API key and speak TLS with its context, when it has them.
absl::StatusOr<OpenAiModel> FetchOpenAiModel(const std::string& address, absl::Duration timeout,
                                             const HttpClientOptions& options = {});

class OpenAiSender final : public RequestSender {
 public:
  // `address`: host:port; `model`: what each request's "model" names.
  OpenAiSender(std::string address, std::string model, HttpClientOptions options = {})
      : address_(std::move(address)), model_(std::move(model)), options_(std::move(options)) {}

  // Each streamed choice counts as a token as it comes, and the usage's completion_tokens then
  // corrects the count. A reply other than 200 is a Status of the matching code carrying the
  // server's message; so is an error event in the stream; a stream that ends without [DONE] is
  // Unavailable.
  absl::Status Send(const BenchRequest& request, absl::Duration timeout, const std::function<void(int)>& on_tokens,
                    int* prompt_tokens) override;

 private:
  const std::string address_;
  const std::string model_;
  const HttpClientOptions options_;
};

}  // namespace lamina::bench

#endif  // LAMINA_DEPLOY_BENCH_OPENAI_SENDER_H_
