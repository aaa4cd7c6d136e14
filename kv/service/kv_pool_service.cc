#include "kv/service/kv_pool_service.h"

#include <string>

#include "common/rpc/call_auth.h"

namespace lamina {

grpc::Status KvPoolService::FreeSequences(grpc::ServerContext* context, const lamina::v1::FreeSequencesRequest* request,
                                          lamina::v1::FreeSequencesResponse* response) {
  if (grpc::Status auth = CheckClusterAuth(*context, secret_); !auth.ok()) return auth;
  std::lock_guard<std::mutex> lock(*mu_);
  for (int64_t seq : request->seq_ids()) executor_->Free(seq);
  response->set_kv_free_slots(executor_->num_free_slots());
  response->set_num_sequences(executor_->num_sequences());
  return grpc::Status::OK;
}

grpc::Status KvPoolService::ForkSequence(grpc::ServerContext* context, const lamina::v1::ForkSequenceRequest* request,
                                         lamina::v1::ForkSequenceResponse* response) {
  if (grpc::Status auth = CheckClusterAuth(*context, secret_); !auth.ok()) return auth;
  std::lock_guard<std::mutex> lock(*mu_);
  absl::Status status =
      executor_->Fork(request->from_seq_id(), request->to_seq_id(), request->length() > 0 ? request->length() : -1);
  if (!status.ok()) return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
  response->set_kv_free_slots(executor_->num_free_slots());
  return grpc::Status::OK;
}

}  // namespace lamina
