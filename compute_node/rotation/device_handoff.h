// GPU-to-GPU hand-overs between the compute nodes of one host, for rotational pipelining: a
// batch's residual stream and attention output written by the sending GPU straight into buffers on
// the receiving GPU (shared through CUDA IPC), then a flag raised there that a wait queued ahead
// on the receiver's stream spins on, as the cuda_ipc data plane does (device_link.h). No host
// thread is on the path, so each node queues all of its slices of a step ahead.
//
// The receiving node owns a DeviceInbox per batch and offers it when the previous replica
// connects (residual_inbox.h); the sender opens it as a DeviceOutlet. One buffer per batch
// suffices: a batch's hand-overs to a node are read before the batch can come back round to its
// sender. Hand-over `value` (a number both ends derive from the step, the pass and the slice)
// raises the flag to 2 value + 1 after the residual stream and 2 value + 2 after the attention
// output, and the receiver waits for exactly 2 value + 2, so a late write from an abandoned step
// never passes for the current one. A wait gives up after the shape's timeout, or at once when the
// receiver aborts it (the sender's connection closed); the receiver's TakeStatus then reports it.
// Thread-compatible: one step at a time per batch.
#ifndef LAMINA_COMPUTE_NODE_ROTATION_DEVICE_HANDOFF_H_
#define LAMINA_COMPUTE_NODE_ROTATION_DEVICE_HANDOFF_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

struct CUstream_st;

namespace lamina {

struct HandoffShape {
  int64_t max_rows = 0;  // the most batch rows one hand-over carries
  int64_t hidden = 0;    // floats of a residual row
  int64_t q_size = 0;    // floats of an attention output row
  absl::Duration timeout = absl::Seconds(10);  // how long a queued wait may spin
};

class DeviceInbox {
 public:
  virtual ~DeviceInbox() = default;
  // What the sender needs to open this inbox (its buffers' IPC handles and shape).
  virtual const std::string& Offer() const = 0;
  // Queues on `stream`: waits for hand-over `value`, then copies its `rows` rows into `residual`
  // [rows, hidden] and `attn_out` [rows, q_size], device memory of this GPU.
  virtual absl::Status QueueReceive(uint64_t value, int64_t rows, float* residual, float* attn_out,
                                    CUstream_st* stream) = 0;
  // Host, once the stream's work is done: OK, DeadlineExceeded when a wait gave up, or Unavailable
  // after Abort (cleared).
  virtual absl::Status TakeStatus() = 0;
  // Host, from any thread while a step is queued or running (not during TakeStatus): the sender is
  // gone (its connection closed). The waits give up now rather than after the timeout, and so does
  // every wait queued before TakeStatus.
  virtual absl::Status Abort() = 0;
  // Forgets earlier hand-overs (a new sender connected).
  virtual absl::Status Reset() = 0;
};

class DeviceOutlet {
 public:
  virtual ~DeviceOutlet() = default;
  // Queue on `stream` the send of `rows` rows of device memory of this GPU: the residual stream
  // [rows, hidden] first, then the attention output [rows, q_size], as hand-over `value`.
  virtual absl::Status QueueSendResidual(uint64_t value, const float* residual, int64_t rows,
                                         CUstream_st* stream) = 0;
  virtual absl::Status QueueSendAttnOut(uint64_t value, const float* attn_out, int64_t rows,
                                        CUstream_st* stream) = 0;
};

// On GPU `device`. FailedPrecondition in a build without CUDA.
absl::StatusOr<std::unique_ptr<DeviceInbox>> CreateDeviceInbox(const HandoffShape& shape, int device);
// Opens the inbox `offer` describes, from GPU `device` of another process. FailedPrecondition when
// it cannot be mapped (another host, no peer access, no CUDA), InvalidArgument when its shape is
// not `shape`.
absl::StatusOr<std::unique_ptr<DeviceOutlet>> OpenDeviceOutlet(const HandoffShape& shape, int device,
                                                               const std::string& offer);

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_ROTATION_DEVICE_HANDOFF_H_
