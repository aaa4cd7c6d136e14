#include "deploy/bench/request_sender.h"

namespace lamina::bench {

absl::Status GrpcSender::Send(const BenchRequest& r, absl::Duration timeout, const std::function<void(int)>& on_tokens,
                              int* prompt_tokens) {
  lamina::v1::GenerateRequest request;
  if (!r.prompt_ids.empty()) {
    request.mutable_token_ids()->mutable_ids()->Add(r.prompt_ids.begin(), r.prompt_ids.end());
  } else {
    request.set_text(r.prompt_text);
  }
  request.set_max_tokens(r.output_tokens);
  request.set_ignore_eos(true);  // outputs run to their drawn length
  return client_->Generate(
      request,
      [&](const lamina::v1::GenerateResponse& response) {
        if (response.token_ids_size() > 0) on_tokens(response.token_ids_size());
        if (response.finish_reason() != lamina::v1::FINISH_REASON_UNSPECIFIED)
          *prompt_tokens = response.prompt_tokens();
      },
      timeout);
}

}  // namespace lamina::bench
