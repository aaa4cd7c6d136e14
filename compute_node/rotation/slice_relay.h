// The SliceHandoff of one batch on one compute node, over the data-plane transport: slice inputs
// go to the next replica's ResidualInbox on a connection opened on first use (and again after a
// failure), and come from the previous replica through this node's inbox.
//
// Messages are tagged with the step and the pass, so a hand-over left over from an abandoned step
// is skipped, never mistaken for the current one. Between GPU nodes that agreed on it when they
// connected (residual_inbox.h), a pass of at most the shape's rows hands over GPU to GPU
// instead, hand-over values derived from the same tag and the slice. A receive waits at most `timeout`; then, or when
// the connection breaks, the step fails with Unavailable naming the replica it waited for, and the
// coordinator ends the batch (no call waits forever). An outlet given up (the next replica went
// away) is retired to the process's QuiescentRelease, as closing its IPC mapping waits for the GPU.
// Thread-compatible: one step at a time (the coordinator keeps one step in flight per batch).
#ifndef LAMINA_COMPUTE_NODE_ROTATION_SLICE_RELAY_H_
#define LAMINA_COMPUTE_NODE_ROTATION_SLICE_RELAY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/metrics/busy_meter.h"
#include "common/transport/peer_watch.h"
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
  // `transport` and `inbox` must outlive the relay. With `device` (device >= 0), hand-overs to the
  // next replica go GPU to GPU where it offers that.
  SliceRelay(Transport* transport, ResidualInbox* inbox, SliceRoute route, RelayPeers peers, absl::Duration timeout,
             const DeviceHandoffs& device = {});

  const SliceRoute& route() const { return route_; }
  // While this waits for a hand-over, `computing` is paused (as RemoteAttention pauses it while
  // waiting on memory nodes), so a node's busy fraction leaves the pipeline's bubbles out.
  void set_compute_meter(BusyUnion* computing) { computing_ = computing; }
  // A new step; its passes are numbered from 0. Connects to the next replica if need be (a
  // failure is reported by the first hand-over).
  void BeginStep(uint64_t step_id);
  // The step failed here: the next replica, which may be waiting for hand-overs this node will
  // not send, learns it at once, as its connection from this node closes (its waits end, and its
  // step fails and closes its own, round the ring), rather than at the step's timeout; so does the
  // previous one, whose sends to this node fail as its connection closes too. The next step
  // connects afresh.
  void AbandonStep();
  // The step ended here without failing (call before answering it): forgets the previous
  // replica's connection if it closed, so the next step waits for the one that replaces it.
  void EndStep();

  bool Owns(int64_t slice) const override { return route_.Owns(slice); }
  void BeginPass() override { ++pass_; }
  absl::Status SendResidual(int64_t slice, absl::Span<const float> residual) override;
  absl::Status SendAttnOut(int64_t slice, absl::Span<const float> attn_out) override;
  absl::Status Receive(int64_t slice, absl::Span<float> residual, absl::Span<float> attn_out) override;

  bool SendsOnDevice(int64_t rows) override;
  bool ReceivesOnDevice(int64_t rows) override;
  absl::Status QueueSendResidual(int64_t slice, const float* residual, int64_t rows, CUstream_st* stream) override;
  absl::Status QueueSendAttnOut(int64_t slice, const float* attn_out, int64_t rows, CUstream_st* stream) override;
  absl::Status QueueReceive(int64_t slice, int64_t rows, float* residual, float* attn_out,
                            CUstream_st* stream) override;
  absl::Status TakeDeviceStatus() override;

 private:
  uint64_t tag() const { return (step_id_ << 8) | static_cast<uint64_t>(pass_ & 0xff); }
  // A device hand-over's value (device_handoff.h): the tag, then the slice (below 1024).
  absl::StatusOr<uint64_t> DeviceValue(int64_t slice) const;
  // Connects to the next replica: the hello, and GPU to GPU if both can.
  absl::Status Connect();
  absl::Status Send(uint32_t type, int64_t slice, absl::Span<const float> data);
  absl::Status ReceiveOne(uint32_t type, int64_t slice, absl::Span<float> out, absl::Time deadline);
  // A connection from the previous replica found closed before any of this step came on it may
  // be one it closed giving the step before up (AbandonStep) after this node's EndStep looked,
  // its successor on the way: the batch's connection once that successor is there, or `closed`
  // if none is by `until` (the previous replica died, or gave this step up: the caller fails).
  std::shared_ptr<Connection> SuccessorOf(const std::shared_ptr<Connection>& closed, absl::Time until);

  Transport* transport_;
  ResidualInbox* inbox_;
  const SliceRoute route_;
  const RelayPeers peers_;
  const absl::Duration timeout_;
  uint64_t step_id_ = 0;
  int pass_ = -1;
  bool heard_this_step_ = false;  // a hand-over of this step came from the previous replica
  BusyUnion* computing_ = nullptr;
  std::unique_ptr<Connection> outbound_;
  std::vector<uint8_t> payload_;
  const DeviceHandoffs device_;
  std::unique_ptr<DeviceOutlet> outlet_;  // with outbound_, when the next replica takes GPU hand-overs
  DeviceInbox* device_inbox_ = nullptr;   // this pass's, when the previous replica sends GPU to GPU
  bool received_on_device_ = false;       // this pass queued a wait on device_inbox_
  // From ReceivesOnDevice to TakeDeviceStatus: the sender's connection, watched so that its close
  // aborts device_inbox_'s waits. The watch stops before the rest is destroyed.
  std::shared_ptr<Connection> watched_sender_;
  PeerWatch watch_;
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_ROTATION_SLICE_RELAY_H_
