// Keeps a node known to the coordinator: registers (retrying until the coordinator answers), then
// sends a heartbeat every interval the coordinator asked for; registers again when the coordinator
// answers that it does not know the node (it restarted, or declared the node dead), and says when
// the coordinator is a new one.
// Thread-safe; runs on its own thread until destroyed.
#ifndef LAMINA_COMMON_RPC_NODE_AGENT_H_
#define LAMINA_COMMON_RPC_NODE_AGENT_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "common/security/cluster_secret.h"
#include "lamina/v1/cluster.grpc.pb.h"

namespace lamina {

class NodeAgent {
 public:
  // `report` fills a heartbeat's load figures (called on the agent's thread).
  using Report = std::function<void(lamina::v1::HeartbeatRequest*)>;

  // `on_new_coordinator` (may be empty) runs on the agent's thread when the node registers with a
  // coordinator other than the one it registered with before (one that restarted): the node drops
  // what it held for the old one's requests.
  // Calls carry the cluster secret's token when there is one.
  // `coordinator`: a channel to the coordinator's gRPC address (CreateControlChannel).
  NodeAgent(std::shared_ptr<grpc::Channel> coordinator, lamina::v1::RegisterRequest registration,
            std::optional<ClusterSecret> secret, Report report, std::function<void()> on_new_coordinator = nullptr);
  ~NodeAgent();
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

 private:
  void Loop();
  bool Sleep(int milliseconds);  // false when stopping

  std::unique_ptr<lamina::v1::Cluster::Stub> stub_;
  lamina::v1::RegisterRequest registration_;
  std::optional<ClusterSecret> secret_;
  Report report_;
  std::function<void()> on_new_coordinator_;
  uint64_t epoch_ = 0;  // the coordinator's last registered with; 0: none yet
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_RPC_NODE_AGENT_H_
