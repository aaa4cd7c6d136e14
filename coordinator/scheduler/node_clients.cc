#include "coordinator/scheduler/node_clients.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/rpc/call_auth.h"
#include "common/rpc/channel.h"
#include "common/status/status_macros.h"

namespace lamina {

ComputeClient::ComputeClient(const std::string& name, const std::string& address,
                             std::optional<ClusterSecret> secret)
    : name_(name),
      secret_(std::move(secret)),
      stub_(lamina::v1::ComputeNode::NewStub(CreateControlChannel(address))) {}

ComputeClient::~ComputeClient() { Reset(); }

void ComputeClient::Reset() {
  if (stream_) {
    Abort();
    stream_->Finish().ok();
  }
  stream_.reset();
  std::lock_guard<std::mutex> lock(context_mu_);
  context_.reset();
}

void ComputeClient::Abort() {
  std::lock_guard<std::mutex> lock(context_mu_);
  if (context_) context_->TryCancel();
}

void ComputeClient::Send(const lamina::v1::StepPlan& plan) {
  if (!stream_) {
    std::lock_guard<std::mutex> lock(context_mu_);
    context_ = std::make_unique<grpc::ClientContext>();
    AddClusterAuth(context_.get(), secret_);
    stream_ = stub_->Step(context_.get());
  }
  send_failed_ = !stream_->Write(plan);
}

absl::StatusOr<lamina::v1::StepResult> ComputeClient::Receive() {
  if (!stream_) return absl::FailedPreconditionError("no step was sent");
  lamina::v1::StepResult result;
  if (send_failed_ || !stream_->Read(&result)) return Broken();
  return result;
}

absl::Status ComputeClient::Broken() {
  grpc::Status status = stream_->Finish();
  stream_.reset();
  send_failed_ = false;
  return absl::UnavailableError(
      absl::StrCat("compute node '", name_, "': ", status.ok() ? "stream closed" : status.error_message()));
}

MemoryClients::MemoryClients(const std::map<std::string, std::vector<std::string>>& nodes,
                             std::optional<ClusterSecret> secret)
    : secret_(std::move(secret)) {
  for (const auto& [name, addresses] : nodes) {
    for (const std::string& address : addresses) {
      stubs_[name].push_back(lamina::v1::MemoryNode::NewStub(CreateControlChannel(address)));
    }
  }
}

absl::StatusOr<const MemoryClients::Stubs*> MemoryClients::StubsOf(const std::string& node) {
  auto it = stubs_.find(node);
  if (it == stubs_.end()) return absl::NotFoundError(absl::StrCat("unknown memory node ", node));
  return &it->second;
}

absl::StatusOr<lamina::v1::FreeSequencesResponse> MemoryClients::Free(const std::string& node, const std::vector<int64_t>& seqs) {
  LAMINA_ASSIGN_OR_RETURN(const Stubs* stubs, StubsOf(node));
  lamina::v1::FreeSequencesRequest request;
  for (int64_t s : seqs) request.add_seq_ids(s);
  lamina::v1::FreeSequencesResponse first;
  for (size_t i = 0; i < stubs->size(); ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    AddClusterAuth(&context, secret_);
    lamina::v1::FreeSequencesResponse response;
    grpc::Status status = (*stubs)[i]->FreeSequences(&context, request, &response);
    if (!status.ok()) {
      return absl::UnavailableError(absl::StrCat("memory node ", node, i > 0 ? absl::StrCat(" (rank ", i, ")") : "",
                                                 ": ", status.error_message()));
    }
    if (i == 0) first = std::move(response);
  }
  return first;
}

absl::Status MemoryClients::Fork(const std::string& node, int64_t from, int64_t to, int64_t length) {
  LAMINA_ASSIGN_OR_RETURN(const Stubs* stubs, StubsOf(node));
  lamina::v1::ForkSequenceRequest request;
  request.set_from_seq_id(from);
  request.set_to_seq_id(to);
  request.set_length(length);
  for (size_t i = 0; i < stubs->size(); ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    AddClusterAuth(&context, secret_);
    lamina::v1::ForkSequenceResponse response;
    grpc::Status status = (*stubs)[i]->ForkSequence(&context, request, &response);
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("memory node ", node, i > 0 ? absl::StrCat(" (rank ", i, ")") : "", ": ",
                                       status.error_message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace lamina
