#include "compute_node/rotation/slice_relay.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status/status_macros.h"
#include "common/threading/quiescent_release.h"

namespace lamina {
namespace {

const char* InputName(uint32_t type) { return type == handoff::kResidual ? "residual stream" : "attention output"; }

// How long a receive that found the previous replica's connection closed waits for the one that
// replaces it (SliceRelay::SuccessorOf).
constexpr absl::Duration kSuccessorGrace = absl::Milliseconds(500);

}  // namespace

SliceRelay::SliceRelay(Transport* transport, ResidualInbox* inbox, SliceRoute route, RelayPeers peers,
                       absl::Duration timeout, const DeviceHandoffs& device)
    : transport_(transport),
      inbox_(inbox),
      route_(route),
      peers_(std::move(peers)),
      timeout_(timeout),
      device_(device) {}

void SliceRelay::BeginStep(uint64_t step_id) {
  step_id_ = step_id;
  pass_ = -1;
  heard_this_step_ = false;
  // A look at the connection shows whether the next replica still takes this batch: it closes it
  // when it gives a step up (AbandonStep), and a restarted one needs a new hello (and its GPU inbox
  // is new memory). Either way this step connects afresh, so the next replica always has a
  // connection from this node to wait on, which closes if this node gives the step up.
  if (outbound_ != nullptr && outbound_->PeerClosed()) {
    outbound_.reset();
    QuiescentRelease::Process().Retire(std::move(outlet_));
  }
  if (outbound_ == nullptr) Connect().IgnoreError();  // the first hand-over reports it
}

void SliceRelay::EndStep() {
  // The previous replica closes its connection when a step fails there (AbandonStep), and it
  // begins the next step, connecting afresh, only once this node has answered this one: a
  // connection found closed now is done with, and the next step waits for its successor.
  absl::StatusOr<std::shared_ptr<Connection>> inbound = inbox_->Await(route_.batch, absl::Now());
  if (inbound.ok() && (*inbound)->PeerClosed()) inbox_->Drop(route_.batch, *inbound);
}

void SliceRelay::AbandonStep() {
  outbound_.reset();
  QuiescentRelease::Process().Retire(std::move(outlet_));
  // And the previous replica, which may be blocked sending what this node will not take.
  absl::StatusOr<std::shared_ptr<Connection>> inbound = inbox_->Await(route_.batch, absl::Now());
  if (inbound.ok()) inbox_->Drop(route_.batch, *inbound);  // which closes it
}

absl::Status SliceRelay::Connect() {
  QuiescentRelease::Process().Retire(std::move(outlet_));
  absl::StatusOr<std::unique_ptr<Connection>> connection =
      transport_->Connect(peers_.next_address, absl::Now() + timeout_);
  if (!connection.ok()) return connection.status();
  MessageHeader hello;
  hello.type = handoff::kHello;
  hello.tag = static_cast<uint64_t>(route_.batch);
  const ByteSpan name(reinterpret_cast<const uint8_t*>(peers_.self.data()), peers_.self.size());
  LAMINA_RETURN_IF_ERROR((*connection)->Send(hello, {name}));
  // The reply offers the next replica's GPU inbox for the batch (empty: none).
  MessageHeader reply;
  LAMINA_RETURN_IF_ERROR((*connection)->Receive(&reply, &payload_, absl::Now() + timeout_));
  if (reply.type != handoff::kHelloReply) {
    return absl::InternalError(absl::StrCat("answered the hello with message type ", reply.type));
  }
  if (!payload_.empty() && device_.device >= 0) {
    absl::StatusOr<std::unique_ptr<DeviceOutlet>> outlet =
        OpenDeviceOutlet(device_.shape, device_.device, std::string(payload_.begin(), payload_.end()));
    if (outlet.ok()) {
      outlet_ = *std::move(outlet);
      std::fprintf(stderr, "rotational pipelining: batch %d goes to compute node '%s' GPU to GPU\n", route_.batch,
                   peers_.next.c_str());
    } else {
      std::fprintf(stderr, "rotational pipelining: batch %d goes to compute node '%s' through host memory: %s\n",
                   route_.batch, peers_.next.c_str(), std::string(outlet.status().message()).c_str());
    }
  }
  MessageHeader ack;
  ack.type = handoff::kDeviceAck;
  ack.flags = outlet_ != nullptr ? 1 : 0;
  ack.tag = static_cast<uint64_t>(route_.batch);
  absl::Status sent = (*connection)->Send(ack, {});
  if (!sent.ok()) {
    QuiescentRelease::Process().Retire(std::move(outlet_));
    return sent;
  }
  outbound_ = *std::move(connection);
  return absl::OkStatus();
}

absl::Status SliceRelay::SendResidual(int64_t slice, absl::Span<const float> residual) {
  return Send(handoff::kResidual, slice, residual);
}

absl::Status SliceRelay::SendAttnOut(int64_t slice, absl::Span<const float> attn_out) {
  return Send(handoff::kAttnOut, slice, attn_out);
}

absl::Status SliceRelay::Send(uint32_t type, int64_t slice, absl::Span<const float> data) {
  auto unreachable = [&](const absl::Status& why) {
    outbound_.reset();  // the next step connects again
    return absl::UnavailableError(absl::StrCat("could not hand batch ", route_.batch, "'s slice ", slice,
                                               " to compute node '", peers_.next, "' (", peers_.next_address,
                                               "): ", why.message()));
  };
  if (outbound_ == nullptr) {
    absl::Status connected = Connect();
    if (!connected.ok()) return unreachable(connected);
  }
  MessageHeader header;
  header.type = type;
  header.flags = static_cast<uint32_t>(slice);
  header.tag = tag();
  const ByteSpan bytes(reinterpret_cast<const uint8_t*>(data.data()), data.size() * sizeof(float));
  absl::Status sent = outbound_->Send(header, {bytes});
  return sent.ok() ? sent : unreachable(sent);
}

absl::Status SliceRelay::Receive(int64_t slice, absl::Span<float> residual, absl::Span<float> attn_out) {
  ScopedPause waiting(computing_);
  const absl::Time deadline = absl::Now() + timeout_;
  absl::Status status = ReceiveOne(handoff::kResidual, slice, residual, deadline);
  if (status.ok()) status = ReceiveOne(handoff::kAttnOut, slice, attn_out, deadline);
  return status;
}

absl::Status SliceRelay::ReceiveOne(uint32_t type, int64_t slice, absl::Span<float> out, absl::Time deadline) {
  auto failed = [&](const absl::Status& why) {
    return absl::UnavailableError(absl::StrCat("batch ", route_.batch, "'s ", InputName(type), " for slice ", slice,
                                               " did not come from compute node '", peers_.previous, "': ",
                                               why.message()));
  };
  absl::StatusOr<std::shared_ptr<Connection>> connection = inbox_->Await(route_.batch, deadline);
  if (!connection.ok()) return failed(connection.status());
  for (;;) {
    MessageHeader header;
    absl::Status received = (*connection)->Receive(&header, &payload_, deadline);
    if (!received.ok()) {
      // Broken, or cut mid-message by the deadline: either way the connection is done.
      inbox_->Drop(route_.batch, *connection);
      if (!heard_this_step_ && absl::IsUnavailable(received)) {
        std::shared_ptr<Connection> successor =
            SuccessorOf(*connection, std::min(deadline, absl::Now() + kSuccessorGrace));
        if (successor != *connection) {
          connection = std::move(successor);
          continue;
        }
      }
      return failed(received);
    }
    if ((header.tag >> 8) == step_id_) heard_this_step_ = true;
    if (header.tag < tag()) continue;  // from a step that was abandoned
    if (header.tag != tag() || header.type != type || header.flags != static_cast<uint32_t>(slice)) {
      inbox_->Drop(route_.batch, *connection);
      return absl::InternalError(absl::StrCat("batch ", route_.batch, ": compute node '", peers_.previous,
                                              "' handed over message type ", header.type, " for slice ", header.flags,
                                              " (tag ", header.tag, ") while this node waited for the ",
                                              InputName(type), " of slice ", slice, " (tag ", tag(), ")"));
    }
    if (payload_.size() != out.size() * sizeof(float)) {
      return absl::InternalError(absl::StrCat("batch ", route_.batch, ": compute node '", peers_.previous,
                                              "' handed over ", payload_.size() / sizeof(float), " floats of ",
                                              InputName(type), " for slice ", slice, "; expected ", out.size()));
    }
    std::memcpy(out.data(), payload_.data(), payload_.size());
    return absl::OkStatus();
  }
}

std::shared_ptr<Connection> SliceRelay::SuccessorOf(const std::shared_ptr<Connection>& closed, absl::Time until) {
  for (;;) {
    absl::StatusOr<std::shared_ptr<Connection>> latest = inbox_->Await(route_.batch, absl::Now());
    if (latest.ok() && *latest != closed) return *std::move(latest);
    if (absl::Now() >= until) return closed;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

bool SliceRelay::SendsOnDevice(int64_t rows) {
  return outbound_ != nullptr && outlet_ != nullptr && rows <= device_.shape.max_rows;
}

bool SliceRelay::ReceivesOnDevice(int64_t rows) {
  received_on_device_ = false;
  device_inbox_ = nullptr;
  if (!inbox_->offers_device() || rows > inbox_->device_max_rows()) return false;  // no need to wait
  ScopedPause waiting(computing_);
  absl::StatusOr<std::shared_ptr<Connection>> current = inbox_->Await(route_.batch, absl::Now());
  if (current.ok() && (*current)->PeerClosed()) SuccessorOf(*current, absl::Now() + kSuccessorGrace);
  absl::StatusOr<DeviceInbox*> device = inbox_->AwaitDevice(route_.batch, absl::Now() + timeout_);
  device_inbox_ = device.ok() ? *device : nullptr;
  if (device_inbox_ == nullptr) return false;
  // Until TakeDeviceStatus: a sender that dies mid-step ends this step's waits for it then.
  absl::StatusOr<std::shared_ptr<Connection>> sender = inbox_->Await(route_.batch, absl::Now());
  if (sender.ok()) {
    watched_sender_ = *sender;
    DeviceInbox* inbox = device_inbox_;
    watch_.Arm({{absl::StrCat("compute node '", peers_.previous, "' (batch ", route_.batch, "'s hand-overs)"),
                 watched_sender_.get(), [inbox] { return inbox->Abort(); }}});
  }
  return true;
}

absl::StatusOr<uint64_t> SliceRelay::DeviceValue(int64_t slice) const {
  if (slice < 0 || slice >= 1024) {
    return absl::InvalidArgumentError(absl::StrCat("slice ", slice, ": GPU hand-overs number slices below 1024"));
  }
  return (tag() << 10) | static_cast<uint64_t>(slice);
}

absl::Status SliceRelay::QueueSendResidual(int64_t slice, const float* residual, int64_t rows, CUstream_st* stream) {
  if (outlet_ == nullptr) return absl::FailedPreconditionError("no GPU hand-overs to the next compute node");
  LAMINA_ASSIGN_OR_RETURN(const uint64_t value, DeviceValue(slice));
  return outlet_->QueueSendResidual(value, residual, rows, stream);
}

absl::Status SliceRelay::QueueSendAttnOut(int64_t slice, const float* attn_out, int64_t rows, CUstream_st* stream) {
  if (outlet_ == nullptr) return absl::FailedPreconditionError("no GPU hand-overs to the next compute node");
  LAMINA_ASSIGN_OR_RETURN(const uint64_t value, DeviceValue(slice));
  return outlet_->QueueSendAttnOut(value, attn_out, rows, stream);
}

absl::Status SliceRelay::QueueReceive(int64_t slice, int64_t rows, float* residual, float* attn_out,
                                      CUstream_st* stream) {
  if (device_inbox_ == nullptr) {
    return absl::FailedPreconditionError("no GPU hand-overs from the previous compute node");
  }
  LAMINA_ASSIGN_OR_RETURN(const uint64_t value, DeviceValue(slice));
  received_on_device_ = true;
  return device_inbox_->QueueReceive(value, rows, residual, attn_out, stream);
}

absl::Status SliceRelay::TakeDeviceStatus() {
  watch_.Disarm();
  watched_sender_.reset();
  if (!received_on_device_) return absl::OkStatus();
  received_on_device_ = false;
  absl::Status status = device_inbox_->TakeStatus();
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("batch ", route_.batch, " did not come from compute node '",
                                                  peers_.previous, "' GPU to GPU: ", status.message()));
}

}  // namespace lamina
