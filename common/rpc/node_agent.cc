#include "common/rpc/node_agent.h"

#include <chrono>

#include "common/rpc/call_auth.h"

namespace lamina {

NodeAgent::NodeAgent(std::shared_ptr<grpc::Channel> coordinator, lamina::v1::RegisterRequest registration,
                     std::optional<ClusterSecret> secret, Report report, std::function<void()> on_new_coordinator)
    : stub_(lamina::v1::Cluster::NewStub(coordinator)),
      registration_(std::move(registration)),
      secret_(std::move(secret)),
      report_(std::move(report)),
      on_new_coordinator_(std::move(on_new_coordinator)) {
  thread_ = std::thread([this] { Loop(); });
}

NodeAgent::~NodeAgent() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
}

bool NodeAgent::Sleep(int milliseconds) {
  std::unique_lock<std::mutex> lock(mu_);
  return !stop_cv_.wait_for(lock, std::chrono::milliseconds(milliseconds), [&] { return stopping_; });
}

void NodeAgent::Loop() {
  int interval_ms = 500;
  bool registered = false;
  do {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    // Wait for the connection within the deadline: with the synchronous API a connection
    // attempt only progresses while a call waits on it.
    context.set_wait_for_ready(true);
    AddClusterAuth(&context, secret_);
    if (!registered) {
      lamina::v1::RegisterResponse response;
      if (stub_->Register(&context, registration_, &response).ok()) {
        registered = true;
        if (response.heartbeat_interval_ms() > 0) interval_ms = response.heartbeat_interval_ms();
        const uint64_t epoch = response.coordinator_epoch();
        if (epoch_ != 0 && epoch != epoch_ && on_new_coordinator_) on_new_coordinator_();
        epoch_ = epoch;
      }
      continue;  // the do-while sleeps, then heartbeats
    }
    lamina::v1::HeartbeatRequest request;
    request.set_name(registration_.name());
    report_(&request);
    lamina::v1::HeartbeatResponse response;
    grpc::Status status = stub_->Heartbeat(&context, request, &response);
    if (status.ok() && !response.known()) registered = false;
  } while (Sleep(registered ? interval_ms : 200));
}

}  // namespace lamina
