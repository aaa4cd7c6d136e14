// A bench's requests over OpenAI's HTTP API: POST /v1/completions, streamed, with the usage at the
// end, to Lamina's coordinator (its `http_port`) or to any OpenAI-compatible server (vLLM, SGLang,
// TGI), so that one workload can be measured on each. Requests carry vLLM's `ignore_eos`, which
// such servers take, so that outputs run to their drawn length.
// Thread-safe: every request has a connection of its own.
#ifndef LAMINA_DEPLOY_BENCH_OPENAI_SENDER_H_
#define LAMINA_DEPLOY_BENCH_OPENAI_SENDER_H_

#include <string>

#include "absl/status/statusor.h"
#include "deploy/bench/request_sender.h"

namespace lamina::bench {

// "http://host:port", "http://host:port/" or "host:port" as host:port; InvalidArgument for
// https or a path.
absl::StatusOr<std::string> OpenAiAddress(const std::string& url);

// The server's first model (GET /v1/models) and its context, vLLM's `max_model_len` (0 when the
// server does not say).
struct OpenAiModel {
  std::string id;
  int max_context = 0;
};

// With `api_key` (by default LAMINA_API_KEY's), requests send it as `Authorization: Bearer KEY`.
absl::StatusOr<OpenAiModel> FetchOpenAiModel(const std::string& address, absl::Duration timeout,
                                             const std::string& api_key = "");

class OpenAiSender final : public RequestSender {
 public:
  // `address`: host:port; `model`: what each request's "model" names.
  OpenAiSender(std::string address, std::string model, std::string api_key = "")
      : address_(std::move(address)), model_(std::move(model)), api_key_(KeyOrEnvironment(std::move(api_key))) {}
  // `key`, or else LAMINA_API_KEY's value ("" when unset).
  static std::string KeyOrEnvironment(std::string key);

  // Each streamed choice counts as a token as it comes, and the usage's completion_tokens then
  // corrects the count. A reply other than 200 is a Status of the matching code carrying the
  // server's message; so is an error event in the stream; a stream that ends without [DONE] is
  // Unavailable.
  absl::Status Send(const BenchRequest& request, absl::Duration timeout, const std::function<void(int)>& on_tokens,
                    int* prompt_tokens) override;

 private:
  const std::string address_;
  const std::string model_;
  const std::string api_key_;
};

}  // namespace lamina::bench

#endif  // LAMINA_DEPLOY_BENCH_OPENAI_SENDER_H_
