// The SliceHandoff of one batch on one compute node, over the data-plane transport: slice inputs
// go to the next replica's ResidualInbox on a connection opened on first use (and again after a
// failure), and come from the previous replica through this node's inbox.
//
// Messages are tagged with the step and the pass, so a hand-over left over from an abandoned step
// is skipped, never mistaken for the current one. A receive waits at most `timeout`; then, or when
// the connection breaks, the step fails with Unavailable naming the replica it waited for, and the
// coordinator ends the batch (no call waits forever).
// Thread-compatible: one step at a time (the coordinator keeps one step in flight per batch).
#ifndef LAMINA_COMPUTE_NODE_ROTATION_SLICE_RELAY_H_
#define LAMINA_COMPUTE_NODE_ROTATION_SLICE_RELAY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/metrics/busy_meter.h"
#include "common/transport/transport.h"
#include "compute_node/rotation/residual_inbox.h"
#include "compute_node/rotation/slice_handoff.h"

namespace lamina {

struct RelayPeers {
  std::string self;           // this node's name, sent in the hello
  std::string next;           // the next replica's name and inbox address
  std::string next_address;
  std::string previous;       // the previous replica's name, for messages
};

class SliceRelay : public SliceHandoff {
 public:
  // `transport` and `inbox` must outlive the relay.
  SliceRelay(Transport* transport, ResidualInbox* inbox, SliceRoute route, RelayPeers peers, absl::Duration timeout);

  const SliceRoute& route() const { return route_; }
  // While this waits for a hand-over, `computing` is paused (as RemoteAttention pauses it while
  // waiting on memory nodes), so a node's busy fraction leaves the pipeline's bubbles out.
  void set_compute_meter(BusyUnion* computing) { computing_ = computing; }
  // A new step; its passes are numbered from 0.
  void BeginStep(uint64_t step_id);

  bool Owns(int64_t slice) const override { return route_.Owns(slice); }
  void BeginPass() override { ++pass_; }
  absl::Status SendResidual(int64_t slice, absl::Span<const float> residual) override;
  absl::Status SendAttnOut(int64_t slice, absl::Span<const float> attn_out) override;
  absl::Status Receive(int64_t slice, absl::Span<float> residual, absl::Span<float> attn_out) override;

 private:
  uint64_t tag() const { return (step_id_ << 8) | static_cast<uint64_t>(pass_ & 0xff); }
  absl::Status Send(uint32_t type, int64_t slice, absl::Span<const float> data);
  absl::Status ReceiveOne(uint32_t type, int64_t slice, absl::Span<float> out, absl::Time deadline);

  Transport* transport_;
  ResidualInbox* inbox_;
  const SliceRoute route_;
  const RelayPeers peers_;
  const absl::Duration timeout_;
  uint64_t step_id_ = 0;
  int pass_ = -1;
  BusyUnion* computing_ = nullptr;
  std::unique_ptr<Connection> outbound_;
  std::vector<uint8_t> payload_;
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_ROTATION_SLICE_RELAY_H_
