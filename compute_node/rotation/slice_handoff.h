// A step spanning several compute nodes, rotating or split by layers (common/topology/
// slice_route.h says which slices run where). A SliceHandoff is one replica's view of one batch's
// route: which slices run here, and the hand-over of a slice's inputs (the residual stream, then
// the attention output) to the replica that runs it. ComputeEngine's layer loops consult it; without one every slice runs
// on the engine's own node.
// Thread-compatible: one step at a time.
#ifndef LAMINA_COMPUTE_NODE_ROTATION_SLICE_HANDOFF_H_
#define LAMINA_COMPUTE_NODE_ROTATION_SLICE_HANDOFF_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/topology/slice_route.h"

struct CUstream_st;

namespace lamina {

class SliceHandoff {
 public:
  virtual ~SliceHandoff() = default;

  // Whether slice `slice` of the batch runs on this node.
  virtual bool Owns(int64_t slice) const = 0;
  // A pass through the slices (a step's prefill, or its decode) begins; every replica runs the
  // same passes in the same order.
  virtual void BeginPass() = 0;
  // Hands slice `slice`'s inputs to the replica that runs it: the residual stream [rows, hidden]
  // as soon as the previous slice ends (it travels while attention runs), then the attention
  // output [rows, q_size]. Unavailable names the replica that could not be reached.
  virtual absl::Status SendResidual(int64_t slice, absl::Span<const float> residual) = 0;
  virtual absl::Status SendAttnOut(int64_t slice, absl::Span<const float> attn_out) = 0;
  // Receives both for a slice that runs here after another replica ran the previous one.
  // Unavailable when they do not arrive in time.
  virtual absl::Status Receive(int64_t slice, absl::Span<float> residual, absl::Span<float> attn_out) = 0;

  // GPU to GPU instead (device_handoff.h), by work queued on the engine's stream, for a pass of
  // `rows` rows: whether this pass's hand-overs to the next replica, and those from the previous
  // one, go that way. Both ends of a pair answer alike. Call after BeginPass.
  virtual bool SendsOnDevice(int64_t rows) { return false; }
  virtual bool ReceivesOnDevice(int64_t rows) { return false; }
  // Device memory of this GPU: residual [rows, hidden], attn_out [rows, q_size].
  virtual absl::Status QueueSendResidual(int64_t slice, const float* residual, int64_t rows, CUstream_st* stream) {
    return absl::UnimplementedError("no device hand-overs");
  }
  virtual absl::Status QueueSendAttnOut(int64_t slice, const float* attn_out, int64_t rows, CUstream_st* stream) {
    return absl::UnimplementedError("no device hand-overs");
  }
  virtual absl::Status QueueReceive(int64_t slice, int64_t rows, float* residual, float* attn_out,
                                    CUstream_st* stream) {
    return absl::UnimplementedError("no device hand-overs");
  }
  // Once the pass's queued work is done: whether its device hand-overs arrived in time.
  virtual absl::Status TakeDeviceStatus() { return absl::OkStatus(); }
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_ROTATION_SLICE_HANDOFF_H_
