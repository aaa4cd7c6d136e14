// lamina.v1.Generation: the client API. Each Generate call tokenizes (a chat through the model's
// chat template), submits to the scheduler and
// streams what comes back; cancelling the call cancels the request (its KV slots are freed on the
// next iteration). Every call ends with a status: the scheduler's error, or OK after the final
// response, or CANCELLED.
// Thread-safe.
#ifndef LAMINA_COORDINATOR_API_GENERATION_SERVICE_H_
#define LAMINA_COORDINATOR_API_GENERATION_SERVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/chat_template/chat_template.h"
#include "common/model_config/model_config.h"
#include "common/security/api_keys.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/cluster/membership.h"
#include "coordinator/scheduler/scheduler.h"
#include "lamina/v1/generation.grpc.pb.h"

namespace lamina {

class GenerationService final : public lamina::v1::Generation::Service {
 public:
  // `chat_template`: what ChatTemplate::Load gave for the model; chat requests fail with its
  // status when it failed.
  // Calls need one of `keys` (when there are any); Health too unless `open_probes`.
  GenerationService(std::string model_name, const ModelConfig& config, const Tokenizer* tokenizer,
                    absl::StatusOr<ChatTemplate> chat_template, Scheduler* scheduler, Membership* membership,
                    ApiKeys keys = ApiKeys(), bool open_probes = true)
      : model_name_(std::move(model_name)),
        config_(config),
        tokenizer_(tokenizer),
        chat_template_(std::move(chat_template)),
        scheduler_(scheduler),
        membership_(membership),
        keys_(std::move(keys)),
        open_probes_(open_probes) {}

  grpc::Status Generate(grpc::ServerContext* context, const lamina::v1::GenerateRequest* request,
                        grpc::ServerWriter<lamina::v1::GenerateResponse>* writer) override;
  grpc::Status ListModels(grpc::ServerContext* context, const lamina::v1::ListModelsRequest* request,
                          lamina::v1::ListModelsResponse* response) override;
  grpc::Status Health(grpc::ServerContext* context, const lamina::v1::HealthRequest* request,
                      lamina::v1::HealthResponse* response) override;

 private:
  std::string model_name_;
  ModelConfig config_;
  const Tokenizer* tokenizer_;
  absl::StatusOr<ChatTemplate> chat_template_;
  Scheduler* scheduler_;
  Membership* membership_;
  const ApiKeys keys_;
  const bool open_probes_;
};

// absl::Status -> grpc::Status (the codes are the same numbers).
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_API_GENERATION_SERVICE_H_
