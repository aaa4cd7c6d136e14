// The coordinator's calls to its nodes: iteration plans to a compute node (one Step stream per
// client, opened on first use and again after a failure) and frees to the memory nodes.
// Thread-compatible, except Abort(), which any thread may call to end a pending step.
#ifndef LAMINA_COORDINATOR_SCHEDULER_NODE_CLIENTS_H_
#define LAMINA_COORDINATOR_SCHEDULER_NODE_CLIENTS_H_

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/security/cluster_secret.h"
#include "grpcpp/grpcpp.h"
#include "lamina/v1/node.grpc.pb.h"

namespace lamina {

class ComputeClient {
 public:
  // `name` is the node's, for messages; calls carry `secret`'s token when there is one.
  ComputeClient(const std::string& name, const std::string& address, std::optional<ClusterSecret> secret);
  ~ComputeClient();

  // A step in two halves, so that one thread can keep several steps in flight on several
  // clients: Send() the plan, do other work, then Receive() its result. One plan in flight per
  // client. Receive returns Unavailable when the stream broke (the node died, Abort() was called,
  // or the Send failed); the next Send opens a new stream.
  void Send(const lamina::v1::StepPlan& plan);
  absl::StatusOr<lamina::v1::StepResult> Receive();
  void Abort();

 private:
  void Reset();
  absl::Status Broken();

  const std::string name_;
  const std::optional<ClusterSecret> secret_;
  std::unique_ptr<lamina::v1::ComputeNode::Stub> stub_;
  std::mutex context_mu_;
  std::unique_ptr<grpc::ClientContext> context_ ABSL_GUARDED_BY(context_mu_);
  std::unique_ptr<grpc::ClientReaderWriter<lamina::v1::StepPlan, lamina::v1::StepResult>> stream_;
  bool send_failed_ = false;
};

class MemoryClients {
 public:
  // `nodes`: KV pool name -> the gRPC addresses holding it: a memory node's, or a compute node's
  // (a tensor-parallel group's ranks, each holding its heads' share of the pool, which every call
  // reaches in rank order). Calls carry `secret`'s token when there is one.
  MemoryClients(const std::map<std::string, std::vector<std::string>>& nodes, std::optional<ClusterSecret> secret);
  // Frees sequences on a node, waiting at most a second; returns the node's report afterwards.
  absl::StatusOr<lamina::v1::FreeSequencesResponse> Free(const std::string& node, const std::vector<int64_t>& seqs);
  // Starts sequence `to` with the first `length` positions of `from` (shared, not copied).
  absl::Status Fork(const std::string& node, int64_t from, int64_t to, int64_t length);

 private:
  using Stubs = std::vector<std::unique_ptr<lamina::v1::MemoryNode::Stub>>;
  absl::StatusOr<const Stubs*> StubsOf(const std::string& node);

  const std::optional<ClusterSecret> secret_;
  std::map<std::string, Stubs> stubs_;
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SCHEDULER_NODE_CLIENTS_H_
