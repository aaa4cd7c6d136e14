// Device-side data planes: a decode step's q/k/v and attention outputs moving straight between the
// compute node's GPU and a memory node's GPU, with every layer's exchange queued ahead on the two
// GPUs' streams, so that no host thread sits on the per-layer path.
//
// A link joins one compute node (ComputeLinkEnd) and one memory node (MemoryLinkEnd). The compute
// node opens it over the pair's control connection (attention_protocol.h: kOpenLink carries the
// compute end's offer, the reply the memory end's answer); from then on each decode step is
//   compute:  SetRows; per layer and chunk QueueSend, then per chunk QueueReceive; wait; TakeStepStatus
//   memory:   per layer and chunk QueueReceive, store + attention, QueueSend;   wait; TakeStepStatus
// The rows of a layer travel as `chunks` mini-batches (ChunkOf), each with its own flag, so the
// memory node starts attention on the first while the rest are in flight.
//
// Transports: `cuda_ipc` (GPUs of one host: receive buffers shared through CUDA IPC handles, rows
// written by a kernel straight into the peer's memory, then a flag that a kernel queued ahead on the
// receiver spins on; chunks of up to LinkShape::line_rows rows as lines, which carry their own
// tags and are polled, kernels/cuda/line.h, and larger ones up to LinkShape::packet_rows as
// packets, kernels/cuda/packets.h) and `nccl` (NCCL send/recv between the two GPUs, over NVLink in a host and
// InfiniBand/RoCE across hosts; a layer travels in one chunk) and `rdma` (cuda_ipc's flags and
// waits, with RDMA WRITEs over a libibverbs RC queue pair into GPU memory registered for GPUDirect
// RDMA, posted by a host thread once the GPU has staged the rows). A wait gives up after the link's
// timeout, and the step then fails with DeadlineExceeded instead of hanging; or at once when the
// host aborts it (Abort: the peer's control connection closed), and the step fails with Unavailable.
// Thread-compatible: one step at a time per link.
#ifndef LAMINA_DATA_PLANE_DEVICE_LINK_H_
#define LAMINA_DATA_PLANE_DEVICE_LINK_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/cuda/line.h"

struct CUstream_st;

namespace lamina {
namespace kernels::cuda {
struct Packet;  // kernels/cuda/packets.h
}  // namespace kernels::cuda

using GpuStream = CUstream_st*;  // cudaStream_t

struct LinkShape {
  int64_t num_layers = 0;
  int64_t qkv_size = 0;  // floats of one row of q/k/v: q_size + 2 kv_size
  int64_t q_size = 0;    // floats of one row of attention output
  int64_t max_rows = 0;  // the most rows one step sends to the memory node
  int max_chunks = 1;
  absl::Duration timeout = absl::Seconds(10);  // how long a queued wait may spin
  // cuda_ipc: a decode chunk of 1 to line_rows rows travels as lines (kernels/cuda/line.h), which
  // the receiver polls, instead of rows behind a flag; 0: never. The compute end's choice (at most
  // kernels::cuda::ReceiveRowsMaxCount()), carried in its offer.
  int64_t line_rows = 0;
  // cuda_ipc: a decode chunk of at most packet_rows rows travels as packets (kernels/cuda/
  // packets.h), which the receiver polls, instead of lines or rows behind a flag; 0: never. Where
  // the link has packets, lines take no chunk.
  // Packets need the two GPUs joined by NVLink (or to be one GPU): the memory end answers 0 where
  // it cannot tell that they are. The compute end's choice, carried in its offer.
  int64_t packet_rows = 0;
  // cuda_ipc: attention outputs travel as packets in this many equal parts a row, each starting a
  // packet of its own (kernels/cuda/packets.h). Divides q_size. The number of kv heads lets a
  // memory node's attention block send its kv head's outputs itself (any other, they are sent
  // after the launch). The compute end's choice, carried in its offer.
  int64_t out_segments = 1;
};

struct RowRange {
  int64_t first = 0;
  int64_t count = 0;
};

// Chunk `chunk` of `rows` rows split into `chunks` near-equal mini-batches.
inline RowRange ChunkOf(int64_t rows, int chunks, int chunk) {
  const int64_t base = rows / chunks, extra = rows % chunks;
  const int64_t first = chunk * base + std::min<int64_t>(chunk, extra);
  return {first, base + (chunk < extra ? 1 : 0)};
}

// How many chunks a layer of `rows` rows travels in: up to `max_chunks`, each of at least
// `chunk_rows` rows (fewer, a chunk's own launches would cost more than the overlap saves); one
// when chunk_rows < 1.
int ChunksFor(int64_t rows, int max_chunks, int64_t chunk_rows);

// The compute node's end.
class ComputeLinkEnd {
 public:
  virtual ~ComputeLinkEnd() = default;
  virtual std::string transport() const = 0;
  // The most chunks a layer may travel in over this link (at most LinkShape::max_chunks).
  virtual int max_chunks() const = 0;
  // What the memory end needs to join (sent with kOpenLink), then its answer.
  virtual std::string Offer() const = 0;
  virtual absl::Status Accept(const std::string& answer) = 0;

  // Host: the batch rows this step sends to the memory node, in the order it gets them
  // (at most max_rows). Waits for the upload, so call it before queueing the step.
  virtual absl::Status SetRows(absl::Span<const int32_t> rows) = 0;
  // Queues on `stream`: the rows of chunk `chunk` (of `chunks`), gathered from `qkv`
  // [batch rows, qkv_stride] (device memory), sent as layer `layer` of step `step`.
  virtual absl::Status QueueSend(uint64_t step, int64_t layer, int chunk, int chunks, const float* qkv,
                                 int64_t qkv_stride, GpuStream stream) = 0;
  // Queues on `stream`: waits for the chunk's attention outputs, then writes them into their batch
  // rows of `out` [batch rows, out_stride] (device memory).
  virtual absl::Status QueueReceive(uint64_t step, int64_t layer, int chunk, int chunks, float* out,
                                    int64_t out_stride, GpuStream stream) = 0;
  // Host, once the stream's work is done: OK, DeadlineExceeded when a wait gave up, or
  // Unavailable after Abort (cleared).
  virtual absl::Status TakeStepStatus() = 0;
  // Host, from any thread while a step is queued or running (not during TakeStepStatus): the peer
  // is gone (its control connection closed). The step's waits give up now rather than after the
  // link's timeout, and so does every wait queued before TakeStepStatus, which reports Unavailable.
  // The default does nothing: the waits give up after the timeout.
  virtual absl::Status Abort() { return absl::OkStatus(); }

  // Times each layer's round trip on this GPU's clock, for benchmarks (kernels/cuda/data_plane.h,
  // "Hop clocks"): in the steps queued from now on, layer l's sends lower clocks[2 l] to when the
  // first of them starts reading q/k/v, and its receives raise clocks[2 l + 1] to when the last
  // has written its outputs into `out`. `clocks`: [num_layers, 2] words in this GPU's memory, set
  // to UINT64_MAX and 0 before a step; null stops. Unimplemented where kernels of this project do
  // not move the rows (nccl, rdma).
  virtual absl::Status SetHopClock(uint64_t* clocks) {
    return absl::UnimplementedError(transport() + " has no hop clock");
  }

  // A prefill's k/v (kBeginStore): whether this link carries them. Then, on `stream`,
  // QueueSendRows sends `count` consecutive rows of k and v at `rows` [count, stride] (each row's
  // k then v, 2 (qkv_size - q_size) / 2 floats; at most attention_protocol::StoreTransferRows rows)
  // as step `step`'s layer `layer`, and QueueAwait holds the stream until the memory node has
  // stored them (so the receive buffer is free for the next).
  virtual bool can_send_rows() const { return false; }
  virtual absl::Status QueueSendRows(uint64_t step, int64_t layer, const float* rows, int64_t count, int64_t stride,
                                     GpuStream stream) {
    return absl::UnimplementedError(transport() + " does not carry a prefill's k/v");
  }
  virtual absl::Status QueueAwait(uint64_t step, int64_t layer, GpuStream stream) {
    return absl::UnimplementedError(transport() + " does not carry a prefill's k/v");
  }
};

// How a chunk's q/k/v arrive in received() (DeviceHop::in):
//  - behind a flag, once *ready >= ready_value (null `ready`: in place already, ordered on the
//    stream);
//  - as `lines` tagged DeviceHop::tag, mirroring its rows from `mirror` on, where the launch may
//    write;
//  - as `packets` tagged DeviceHop::tag (cuda_ipc between GPUs joined by NVLink,
//    LinkShape::packet_rows; rows of PacketsPerRow(qkv_size) packets), mirroring its rows from
//    `mirror` on; their outputs go back as packets too. With `sender_on_this_gpu`, the compute
//    end's kernels (its sends) run on this GPU, so that a launch polling for them may not fill its
//    SMs (kv/attention/spin_budget.h).
struct HopFlagIn {
  const uint64_t* ready = nullptr;
  uint64_t ready_value = 0;
};
struct HopLinesIn {
  const kernels::cuda::Line* lines = nullptr;
  float* mirror = nullptr;
};
struct HopPacketsIn {
  const kernels::cuda::Packet* packets = nullptr;
  float* mirror = nullptr;
  bool sender_on_this_gpu = false;
};

// How its outputs go back to the compute node (DeviceHop::out):
//  - written to `out` [rows, stride] in its memory, then *done raised to done_value;
//  - as `lines` tagged DeviceHop::tag, mirroring `mirror` [rows, stride] (not written), with no
//    flag: the compute end polls the lines;
//  - as `packets` tagged DeviceHop::tag, rows of q_size floats in `segments` parts
//    (PacketsPerRow(q_size, segments) packets a row; LinkShape::out_segments).
struct HopRowsOut {
  float* out = nullptr;  // the chunk's first output row
  int64_t stride = 0;
  uint64_t* done = nullptr;
  uint64_t done_value = 0;
};
struct HopLinesOut {
  kernels::cuda::Line* lines = nullptr;
  float* mirror = nullptr;
  int64_t stride = 0;
};
struct HopPacketsOut {
  kernels::cuda::Packet* packets = nullptr;
  int64_t segments = 1;
};

// A chunk's hop as device addresses, for an attention launch that receives and sends by itself
// (LinkedDecodeAttention): one launch per chunk instead of a wait, the attention and a send.
// Each side travels its own way; packets go both ways or neither.
struct DeviceHop {
  using FlagIn = HopFlagIn;
  using LinesIn = HopLinesIn;
  using PacketsIn = HopPacketsIn;
  using RowsOut = HopRowsOut;
  using LinesOut = HopLinesOut;
  using PacketsOut = HopPacketsOut;

  // How the launch's waits for the rows give up: after `timeout_ns`, setting *error (the link's
  // error word, TakeStepStatus reads it) to `error_code`.
  int64_t timeout_ns = 0;
  uint32_t* error = nullptr;
  uint32_t error_code = 0;
  uint32_t tag = 0;  // of the lines or packets either way
  std::variant<FlagIn, LinesIn, PacketsIn> in;
  std::variant<RowsOut, LinesOut, PacketsOut> out;
};

// The memory node's end.
class MemoryLinkEnd {
 public:
  virtual ~MemoryLinkEnd() = default;
  virtual std::string transport() const = 0;
  // The first and last layer of the decode step queued next (a compute node that runs only some
  // of a batch's slices sends only their layers); by default every layer.
  virtual void SetStepLayers(int64_t first, int64_t last) {}
  // Queues on `stream`: holds it until chunk `chunk` (of `chunks`, over `rows` rows) of the
  // layer has arrived in received().
  virtual absl::Status QueueReceive(uint64_t step, int64_t layer, int chunk, int chunks, int64_t rows,
                                    GpuStream stream) = 0;
  // Queues on `stream`: holds it until a prefill's k/v piece of `count` rows (kBeginStore, sent
  // with ComputeLinkEnd::QueueSendRows, never as lines) has arrived in received(). By default
  // QueueReceive's for a step of one chunk of `count` rows.
  virtual absl::Status QueueReceiveStore(uint64_t step, int64_t layer, int64_t count, GpuStream stream) {
    return QueueReceive(step, layer, 0, 1, count, stream);
  }
  // Where q/k/v rows arrive: [max_rows, qkv_size], device memory.
  virtual const float* received() const = 0;
  // Queues on `stream`: sends the chunk's outputs, rows [first, first + count) of `out`
  // [rows, out_stride] (device memory), back.
  virtual absl::Status QueueSend(uint64_t step, int64_t layer, int chunk, int chunks, int64_t rows, const float* out,
                                 int64_t out_stride, GpuStream stream) = 0;
  // The chunk's hop for an attention launch to make itself, in place of QueueReceive and
  // QueueSend; nullopt when only the link can move the rows (nccl, rdma). Either way serves every
  // chunk: QueueReceive and QueueSend also take and send a chunk that travels as lines or packets
  // (cuda_ipc's chunks of up to line_rows rows, and of up to packet_rows).
  virtual std::optional<DeviceHop> DirectHop(uint64_t step, int64_t layer, int chunk, int chunks, int64_t rows) {
    return std::nullopt;
  }
  // As ComputeLinkEnd's.
  virtual absl::Status TakeStepStatus() = 0;
  virtual absl::Status Abort() { return absl::OkStatus(); }
};

// The compute end of `transport` ("cuda_ipc", "nccl" or "rdma") on GPU `device`. FailedPrecondition
// when this build or machine cannot (no CUDA, no NCCL, no RDMA device), InvalidArgument for another
// name.
absl::StatusOr<std::unique_ptr<ComputeLinkEnd>> CreateComputeLinkEnd(const std::string& transport,
                                                                     const LinkShape& shape, int device);
// The memory end joining `offer` on GPU `device`, and its answer for the compute end. An offer
// that cannot be read is DataLoss naming the transport.
absl::StatusOr<std::pair<std::unique_ptr<MemoryLinkEnd>, std::string>> CreateMemoryLinkEnd(
    const std::string& transport, const LinkShape& shape, int device, const std::string& offer);

}  // namespace lamina

#endif  // LAMINA_DATA_PLANE_DEVICE_LINK_H_
