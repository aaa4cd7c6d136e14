#include "compute_node/rotation/residual_inbox.h"

#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

namespace lamina {

absl::StatusOr<std::unique_ptr<ResidualInbox>> ResidualInbox::Start(Transport* transport, const std::string& address,
                                                                    const DeviceHandoffs& device) {
  absl::StatusOr<std::unique_ptr<Listener>> listener = transport->Listen(address);
  if (!listener.ok()) {
    return absl::Status(listener.status().code(),
                        absl::StrCat("rotational pipelining: cannot listen for hand-overs at ", address, ": ",
                                     listener.status().message()));
  }
  std::unique_ptr<ResidualInbox> inbox(new ResidualInbox(*std::move(listener)));
  for (int batch = 0; device.device >= 0 && batch < device.batches; ++batch) {
    absl::StatusOr<std::unique_ptr<DeviceInbox>> made = CreateDeviceInbox(device.shape, device.device);
    if (!made.ok()) {
      std::fprintf(stderr, "rotational pipelining: batches are handed over through host memory, as GPU %d cannot "
                   "receive them directly: %s\n", device.device, std::string(made.status().message()).c_str());
      inbox->device_inboxes_.clear();
      break;
    }
    inbox->device_inboxes_[batch] = *std::move(made);
    inbox->device_max_rows_ = device.shape.max_rows;
  }
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
    const int batch = static_cast<int>(hello.tag);
    const std::string sender(payload.begin(), payload.end());
    const bool on_device = AgreeOnDevice(batch, connection.get());
    std::lock_guard<std::mutex> lock(mu_);
    Inbound& inbound = by_batch_[batch];
    if (inbound.connection) inbound.connection->Close();
    inbound.connection = std::move(connection);
    inbound.sender = sender;
    inbound.device = on_device ? device_inboxes_.at(batch).get() : nullptr;
    arrived_.notify_all();
  }
}

bool ResidualInbox::AgreeOnDevice(int batch, Connection* connection) {
  auto it = device_inboxes_.find(batch);
  DeviceInbox* device = it == device_inboxes_.end() ? nullptr : it->second.get();
  std::string offer = device == nullptr ? "" : device->Offer();
  const ByteSpan bytes(reinterpret_cast<const uint8_t*>(offer.data()), offer.size());
  MessageHeader reply{handoff::kHelloReply, 0, static_cast<uint64_t>(batch)};
  if (!connection->Send(reply, {bytes}).ok()) return false;
  MessageHeader ack;
  std::vector<uint8_t> payload;
  absl::Status received = connection->Receive(&ack, &payload, absl::Now() + absl::Seconds(5));
  if (!received.ok() || ack.type != handoff::kDeviceAck || ack.flags != 1 || device == nullptr) return false;
  // A new sender: what an earlier one left in the inbox must not pass for its hand-overs.
  absl::Status reset = device->Reset();
  if (!reset.ok()) {
    std::fprintf(stderr, "rotational pipelining: batch %d is handed over through host memory: %s\n", batch,
                 std::string(reset.message()).c_str());
  }
  return reset.ok();
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

absl::StatusOr<DeviceInbox*> ResidualInbox::AwaitDevice(int batch, absl::Time deadline) {
  LAMINA_ASSIGN_OR_RETURN(std::shared_ptr<Connection> connection, Await(batch, deadline));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_batch_.find(batch);
  return it != by_batch_.end() && it->second.connection == connection ? it->second.device : nullptr;
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
