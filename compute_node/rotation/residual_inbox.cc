#include "compute_node/rotation/residual_inbox.h"

#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"

namespace lamina {

absl::StatusOr<std::unique_ptr<ResidualInbox>> ResidualInbox::Start(Transport* transport, const std::string& address) {
  absl::StatusOr<std::unique_ptr<Listener>> listener = transport->Listen(address);
  if (!listener.ok()) {
    return absl::Status(listener.status().code(),
                        absl::StrCat("rotational pipelining: cannot listen for hand-overs at ", address, ": ",
                                     listener.status().message()));
  }
  std::unique_ptr<ResidualInbox> inbox(new ResidualInbox(*std::move(listener)));
  inbox->acceptor_ = std::thread([p = inbox.get()] { p->AcceptLoop(); });
  return inbox;
}

ResidualInbox::~ResidualInbox() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  listener_->Close();
  acceptor_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [batch, inbound] : by_batch_) inbound.connection->Close();
}

void ResidualInbox::AcceptLoop() {
  std::vector<uint8_t> payload;
  for (;;) {
    absl::StatusOr<std::unique_ptr<Connection>> accepted = listener_->Accept(absl::InfiniteFuture());
    if (!accepted.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ || absl::IsCancelled(accepted.status())) return;
      continue;
    }
    std::shared_ptr<Connection> connection = *std::move(accepted);
    MessageHeader hello;
    absl::Status status = connection->Receive(&hello, &payload, absl::Now() + absl::Seconds(5));
    if (!status.ok() || hello.type != handoff::kHello) {
      std::fprintf(stderr, "rotational pipelining: a connection from %s sent no hello (%s); closed\n",
                   connection->peer().c_str(),
                   status.ok() ? "wrong first message" : std::string(status.message()).c_str());
      connection->Close();
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    Inbound& inbound = by_batch_[static_cast<int>(hello.tag)];
    if (inbound.connection) inbound.connection->Close();
    inbound.connection = std::move(connection);
    inbound.sender.assign(payload.begin(), payload.end());
    arrived_.notify_all();
  }
}

absl::StatusOr<std::shared_ptr<Connection>> ResidualInbox::Await(int batch, absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto it = by_batch_.find(batch);
    if (it != by_batch_.end() && it->second.connection) return it->second.connection;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("no compute node connected to hand over batch ", batch, " (", address(), ")"));
    }
    arrived_.wait_for(lock, absl::ToChronoMilliseconds(std::min(left, absl::Milliseconds(100))));
  }
}

void ResidualInbox::Drop(int batch, const std::shared_ptr<Connection>& connection) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_batch_.find(batch);
  if (it != by_batch_.end() && it->second.connection == connection) by_batch_.erase(it);
  connection->Close();
}

std::string ResidualInbox::SenderOf(int batch) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_batch_.find(batch);
  return it == by_batch_.end() ? "" : it->second.sender;
}

}  // namespace lamina
