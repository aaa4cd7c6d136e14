#include "compute_node/rotation/slice_relay.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace lamina {
namespace {

const char* InputName(uint32_t type) { return type == handoff::kResidual ? "residual stream" : "attention output"; }

}  // namespace

SliceRelay::SliceRelay(Transport* transport, ResidualInbox* inbox, SliceRoute route, RelayPeers peers,
                       absl::Duration timeout)
    : transport_(transport), inbox_(inbox), route_(route), peers_(std::move(peers)), timeout_(timeout) {}

void SliceRelay::BeginStep(uint64_t step_id) {
  step_id_ = step_id;
  pass_ = -1;
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
    absl::StatusOr<std::unique_ptr<Connection>> connection =
        transport_->Connect(peers_.next_address, absl::Now() + timeout_);
    if (!connection.ok()) return unreachable(connection.status());
    MessageHeader hello;
    hello.type = handoff::kHello;
    hello.tag = static_cast<uint64_t>(route_.batch);
    const ByteSpan name(reinterpret_cast<const uint8_t*>(peers_.self.data()), peers_.self.size());
    absl::Status sent = (*connection)->Send(hello, {name});
    if (!sent.ok()) return unreachable(sent);
    outbound_ = *std::move(connection);
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
      return failed(received);
    }
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

}  // namespace lamina
