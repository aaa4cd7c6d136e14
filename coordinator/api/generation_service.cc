#include "coordinator/api/generation_service.h"

#include <vector>

#include "common/chat_template/chat_prompt.h"
#include "compute_node/sampling/sampling_proto.h"

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

// The compute node's log probabilities of `token`, with each token's text added.
void AddLogprobs(int32_t token, const lamina::v1::TokenLogprobs& logprobs, const Tokenizer& tokenizer,
                 lamina::v1::GenerateResponse* response) {
  lamina::v1::TokenLogprobs* out = response->add_logprobs();
  *out = logprobs;
  out->set_token(tokenizer.TokenText(token));
  for (lamina::v1::TokenLogprob& top : *out->mutable_top()) top.set_token(tokenizer.TokenText(top.token_id()));
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

grpc::Status GenerationService::Generate(grpc::ServerContext* context, const lamina::v1::GenerateRequest* request,
                                         grpc::ServerWriter<lamina::v1::GenerateResponse>* writer) {
  GenerationSpec spec;
  if (request->has_token_ids()) {
    spec.prompt.assign(request->token_ids().ids().begin(), request->token_ids().ids().end());
  } else if (request->has_chat()) {
    std::vector<ChatMessage> messages;
    for (const lamina::v1::ChatMessage& m : request->chat().messages()) messages.push_back({m.role(), m.content()});
    absl::StatusOr<std::vector<int32_t>> prompt = EncodeChat(chat_template_, *tokenizer_, messages);
    if (!prompt.ok()) return ToGrpc(prompt.status());
    spec.prompt = *std::move(prompt);
  } else {
    spec.prompt = tokenizer_->EncodePrompt(request->text());
  }
  spec.sampling = SamplingFromProto(request->sampling());
  spec.n = request->n() > 0 ? request->n() : 1;
  spec.stop.max_tokens = request->max_tokens();
  spec.stop.ignore_eos = request->ignore_eos();
  spec.stop.stop_ids.assign(request->stop_token_ids().begin(), request->stop_token_ids().end());
  spec.stop_strings.assign(request->stop_strings().begin(), request->stop_strings().end());

  absl::StatusOr<std::shared_ptr<RequestHandle>> handle = scheduler_->Submit(std::move(spec));
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
      AddLogprobs(event.token_ids[i], event.logprobs[i], *tokenizer_, &response);
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

grpc::Status GenerationService::ListModels(grpc::ServerContext*, const lamina::v1::ListModelsRequest*,
                                           lamina::v1::ListModelsResponse* response) {
  auto* model = response->add_models();
  model->set_name(model_name_);
  model->set_architecture(config_.architecture);
  model->set_max_context(static_cast<int32_t>(config_.max_position_embeddings));
  model->set_vocab_size(static_cast<int32_t>(config_.vocab_size));
  model->set_chat_template(chat_template_.ok());
  return grpc::Status::OK;
}

grpc::Status GenerationService::Health(grpc::ServerContext*, const lamina::v1::HealthRequest*,
                                       lamina::v1::HealthResponse* response) {
  std::string why;
  const bool serving = membership_->AllAlive(&why);
  response->set_status(serving ? lamina::v1::HealthResponse::SERVING : lamina::v1::HealthResponse::NOT_SERVING);
  response->set_detail(why);
  return grpc::Status::OK;
}

}  // namespace lamina
