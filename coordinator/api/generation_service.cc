#include "coordinator/api/generation_service.h"

#include <utility>

#include "common/rpc/call_auth.h"
#include "coordinator/api/generation_request.h"

namespace lamina {
namespace {

lamina::v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEndOfSequence:
      return lamina::v1::FINISH_REASON_END_OF_SEQUENCE;
    case FinishReason::kStopId:
    case FinishReason::kStopString:
      return lamina::v1::FINISH_REASON_STOP;
    case FinishReason::kMaxTokens:
      return lamina::v1::FINISH_REASON_LENGTH;
    case FinishReason::kContextFull:
      return lamina::v1::FINISH_REASON_CONTEXT_FULL;
    case FinishReason::kNone:
      break;
  }
  return lamina::v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

grpc::Status GenerationService::Generate(grpc::ServerContext* context, const lamina::v1::GenerateRequest* request,
                                         grpc::ServerWriter<lamina::v1::GenerateResponse>* writer) {
  if (grpc::Status auth = CheckApiKey(*context, keys_); !auth.ok()) return auth;
  absl::StatusOr<GenerationSpec> spec = ToGenerationSpec(*request, *tokenizer_, chat_template_, config_);
  if (!spec.ok()) {
    scheduler_->CountRefused(spec.status().code());
    return ToGrpc(spec.status());
  }
  absl::StatusOr<std::shared_ptr<RequestHandle>> handle = scheduler_->Submit(*std::move(spec));
  if (!handle.ok()) return ToGrpc(handle.status());
  for (;;) {
    if (context->IsCancelled()) {
      (*handle)->Cancel();
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    }
    RequestEvent event;
    if (!(*handle)->Pop(&event, absl::Milliseconds(50))) continue;
    if (!event.error.ok()) return ToGrpc(event.error);
    lamina::v1::GenerateResponse response;
    response.set_index(event.index);
    for (int32_t id : event.token_ids) response.add_token_ids(id);
    for (size_t i = 0; i < event.logprobs.size() && i < event.token_ids.size(); ++i) {
      *response.add_logprobs() = WithTokenTexts(event.token_ids[i], event.logprobs[i], *tokenizer_);
    }
    response.set_text(event.text);
    if (event.finish != FinishReason::kNone) {
      response.set_finish_reason(ToProto(event.finish));
      response.set_prompt_tokens(event.prompt_tokens);
      response.set_generated_tokens(event.generated_tokens);
    }
    if (!writer->Write(response)) {
      (*handle)->Cancel();
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
    }
    if (event.done) return grpc::Status::OK;
  }
}

grpc::Status GenerationService::ListModels(grpc::ServerContext* context, const lamina::v1::ListModelsRequest*,
                                           lamina::v1::ListModelsResponse* response) {
  if (grpc::Status auth = CheckApiKey(*context, keys_); !auth.ok()) return auth;
  auto* model = response->add_models();
  model->set_name(model_name_);
  model->set_architecture(config_.architecture);
  model->set_max_context(static_cast<int32_t>(config_.max_position_embeddings));
  model->set_vocab_size(static_cast<int32_t>(config_.vocab_size));
  model->set_chat_template(chat_template_.ok());
  return grpc::Status::OK;
}

grpc::Status GenerationService::Health(grpc::ServerContext* context, const lamina::v1::HealthRequest*,
                                       lamina::v1::HealthResponse* response) {
  if (!open_probes_) {
    if (grpc::Status auth = CheckApiKey(*context, keys_); !auth.ok()) return auth;
  }
  std::string why;
  const bool all_alive = membership_->AllAlive(&why);
  response->set_status(all_alive               ? lamina::v1::HealthResponse::SERVING
                       : membership_->CanServe() ? lamina::v1::HealthResponse::DEGRADED
                                                 : lamina::v1::HealthResponse::NOT_SERVING);
  response->set_detail(why);
  return grpc::Status::OK;
}

}  // namespace lamina
