// lamina.v1.MemoryNode over a KV pool: the coordinator's frees and forks of the sequences it placed
// there. Served by memory nodes, and by compute nodes for a pool of their own.
// Thread-safe: every call holds the pool's lock.
#ifndef LAMINA_KV_SERVICE_KV_POOL_SERVICE_H_
#define LAMINA_KV_SERVICE_KV_POOL_SERVICE_H_

#include <mutex>
#include <optional>

#include "common/security/cluster_secret.h"
#include "kv/attention/attention_executor.h"
#include "lamina/v1/node.grpc.pb.h"

namespace lamina {

class KvPoolService final : public lamina::v1::MemoryNode::Service {
 public:
  // `executor` is used only while holding `mu`; both must outlive the service.
  // Calls must carry `secret`'s token, when there is one.
  KvPoolService(AttentionExecutor* executor, std::mutex* mu, std::optional<ClusterSecret> secret)
      : executor_(executor), mu_(mu), secret_(std::move(secret)) {}

  grpc::Status FreeSequences(grpc::ServerContext* context, const lamina::v1::FreeSequencesRequest* request,
                             lamina::v1::FreeSequencesResponse* response) override;
  grpc::Status ForkSequence(grpc::ServerContext* context, const lamina::v1::ForkSequenceRequest* request,
                            lamina::v1::ForkSequenceResponse* response) override;

 private:
  AttentionExecutor* executor_;
  std::mutex* mu_;
  const std::optional<ClusterSecret> secret_;
};

}  // namespace lamina

#endif  // LAMINA_KV_SERVICE_KV_POOL_SERVICE_H_
