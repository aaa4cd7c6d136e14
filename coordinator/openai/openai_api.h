// OpenAI's HTTP API for the model a coordinator serves, over the same scheduler as the gRPC API
// (so any OpenAI client, or a benchmark that speaks it, can drive a Lamina cluster):
//
//   POST /v1/completions        a prompt (or several) in, completions out
//   POST /v1/chat/completions   a conversation through the model's chat template
//   GET  /v1/models             the model; GET /v1/models/{model} the same alone
//   GET  /health                200 while every node is alive, else 503 saying which is not
//   GET  /metrics               the cluster's metrics for Prometheus (coordinator/metrics/metrics_page.h)
//
// Both POSTs answer whole or, with "stream": true, as server-sent events ending in
// "data: [DONE]". A client that hangs up cancels its requests (their KV slots are freed on the
// next iteration). A request that fails before any output gets OpenAI's error body with an HTTP
// status (http 400 names the field); one that fails after streaming began gets an error event,
// then [DONE]. Thread-safe: the HTTP server calls Handle from a thread per connection.
#ifndef LAMINA_COORDINATOR_OPENAI_OPENAI_API_H_
#define LAMINA_COORDINATOR_OPENAI_OPENAI_API_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat_template/chat_template.h"
#include "common/http/http_server.h"
#include "common/model_config/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "common/security/api_keys.h"
#include "coordinator/cluster/membership.h"
#include "coordinator/openai/openai_request.h"
#include "coordinator/scheduler/scheduler.h"

namespace lamina {

class OpenAiApi {
 public:
  // `chat_template`: what ChatTemplate::Load gave for the model (chats fail with its error).
  // Requests need one of `keys` (`Authorization: Bearer KEY`; 401 otherwise) when there are any;
  // /health and /metrics too unless `open_probes`.
  OpenAiApi(std::string model_name, const ModelConfig& config, const Tokenizer* tokenizer,
            absl::StatusOr<ChatTemplate> chat_template, Scheduler* scheduler, Membership* membership,
            ApiKeys keys = ApiKeys(), bool open_probes = true);

  void Handle(const HttpRequest& request, HttpResponder& responder);

 private:
  void Generate(OpenAiEndpoint endpoint, const HttpRequest& request, HttpResponder& responder);
  // Submits each prompt; on a failure cancels those already submitted.
  absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> Submit(const OpenAiRequest& request);

  const std::string model_name_;
  const ModelConfig config_;
  const Tokenizer* tokenizer_;
  const absl::StatusOr<ChatTemplate> chat_template_;
  Scheduler* scheduler_;
  Membership* membership_;
  const ApiKeys keys_;
  const bool open_probes_;
  const int64_t started_;  // Unix seconds, the models' "created"
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_OPENAI_OPENAI_API_H_
