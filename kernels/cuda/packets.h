// Packets: the low-latency form of a hop of many rows between GPUs joined by NVLink (after NCCL's
// LL128 protocol). A row of floats travels as 128-byte packets, each holding 31 of its floats and,
// in its last word, a 32-bit tag that names the hop. Eight lanes of a warp write a packet in one
// store instruction, 16 bytes each, with no fence and no flag after it; the receiver's eight lanes
// load it in one instruction too, and poll until the tag matches.
//
// Lines (line.h) carry a tag in every 8 bytes, so a hop of lines moves twice its rows' bytes; a
// packet's tag costs 1/32 of them. In exchange packets rely on what the PTX memory model does not
// promise: that the 128 bytes of one warp's aligned store arrive whole, so that a packet whose tag
// is there holds its floats too. NCCL's LL128 relies on the same between GPUs joined by NVLink,
// where it is on by default (and off elsewhere, where a PCIe switch or the host may split a write);
// after the tag is seen the receiver loads the packet once more, as NCCL does. Use packets only
// between GPUs joined by NVLink, or within one GPU.
//
// A buffer of packets mirrors rows: row i of `cols` floats is packets [i * stride, i * stride +
// PacketsPerRow(cols)), float c of it in slot c % 31 of packet c / 31. A row may also travel in
// `segments` equal parts, each starting a packet of its own, so that a part can be written by a
// block that holds only that part (a memory node's attention block, its kv head's outputs): part
// s of row i is then packets [i * stride + s * PacketsPerRow(cols / segments), ...). Each hop must
// carry a tag the buffer's packets do not already hold: LineTag(value) of flag values that only
// grow, as lines do (a zeroed buffer holds tag 0, which no hop has).
//
// Launchers queue work on `stream` and never synchronize. Thread-safe.
#ifndef LAMINA_KERNELS_CUDA_PACKETS_H_
#define LAMINA_KERNELS_CUDA_PACKETS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace lamina::kernels::cuda {

constexpr int64_t kPacketFloats = 31;

struct alignas(128) Packet {
  float values[kPacketFloats];
  uint32_t tag;
};
static_assert(sizeof(Packet) == 128, "a packet is one warp-quarter's store");

// ReceivePackets' default: hops of up to 32 polling blocks, as many as ReceiveLines takes (about
// 20 Llama-3-8B q/k/v rows), poll from the start.
constexpr int64_t kMostPacketPollingBlocks = 32;

// Packets a row of `cols` floats takes, in `segments` parts (which must divide cols).
inline int64_t PacketsPerRow(int64_t cols, int64_t segments = 1) {
  return segments * ((cols / segments + kPacketFloats - 1) / kPacketFloats);
}

// dst's packet row i (of `dst_stride` packets, at least PacketsPerRow(cols, segments)) gets src
// row (rows ? rows[i] : i) for i < count, in `segments` parts, tagged `tag`, with no flag after
// them. Nothing is written when *error != 0 (error may be null). `dst` may be a peer GPU's
// memory. A programmatic dependent launch: its blocks may start while the kernel before it on
// `stream` ends, and read nothing until it has. `sent_at`: as SendRows' hop clock (data_plane.h).
// With `receive_starts_early`, a ReceivePackets queued right after it with `starts_with_send`
// starts as soon as the send's blocks have stored their packets, before the send has ended.
absl::Status SendPackets(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                         Packet* dst, int64_t dst_stride, uint32_t tag, const uint32_t* error, cudaStream_t stream,
                         uint64_t* sent_at = nullptr, int64_t segments = 1, bool receive_starts_early = false);

// A hop's packets to receive: `count` rows of `cols` floats in `segments` parts (which must divide
// cols), row i's at `packets` + i * `stride`, each in once tagged `tag`.
struct PacketRows {
  const Packet* packets = nullptr;
  int64_t stride = 0;
  uint32_t tag = 0;
  int64_t count = 0;
  int64_t cols = 0;
  int64_t segments = 1;
};

// How a poll gives up: after `timeout_ns` as WaitFlag does, setting *error = code when still 0.
struct PollLimit {
  int64_t timeout_ns = 0;
  uint32_t* error = nullptr;
  uint32_t code = 0;
};

// Where received rows go: row i to `base` row (rows ? rows[i] : i), rows `stride` floats apart.
struct RowsOut {
  float* base = nullptr;
  int64_t stride = 0;
  const int32_t* rows = nullptr;
};

struct ReceiveOptions {
  uint64_t* back_at = nullptr;  // as ReceiveRows' hop clock (data_plane.h)
  int64_t most_polling_blocks = kMostPacketPollingBlocks;
  bool starts_with_send = false;
};

// Polls `in` until each packet is tagged, and writes its rows to `out`. A poll gives up per `limit`
// (taking the packets as they are), and once *limit.error is set later polls pass at once. A hop of
// up to `options.most_polling_blocks` blocks' packets (ReceivePacketsBlocks) is polled by all its
// blocks from the start; a larger one waits behind one warp polling its first packet, so that its
// blocks hold SMs only while the rows travel (at some latency for a small hop); a chained kernel
// after such a hop (chaining.h) may then place its blocks at once, and waits for its end before
// reading. Any other kernel queued after it starts once it has ended.
// `options.starts_with_send` (a hop polled in two stages starts behind its wait regardless):
// queued on the same stream after the SendPackets of the same exchange, with its
// `receive_starts_early` (other sends may come between, as a compute node sends to each memory
// node before it receives), the blocks start polling once the send's packets are stored, while the
// send ends, so that the GPU's turn from one launch to the next is not on the hop's path. By then
// the send has passed its wait for the kernel before it, so everything queued before the send has
// ended.
absl::Status ReceivePackets(const PacketRows& in, const PollLimit& limit, const RowsOut& out, cudaStream_t stream,
                            const ReceiveOptions& options = {});

// The blocks that poll a hop of `count` rows of `cols` floats in `segments` parts (each 256
// threads).
int64_t ReceivePacketsBlocks(int64_t count, int64_t cols, int64_t segments = 1);

// One warp polls `first` until it is tagged `tag` (giving up as ReceivePackets does), then lets a
// chained kernel after it (chaining.h) start: one that polls the hop's packets itself, and holds
// SMs only once they are on their way. Any other kernel queued after it starts once it has ended.
absl::Status WaitForFirstPacket(const Packet* first, uint32_t tag, int64_t timeout_ns, uint32_t* error, uint32_t code,
                                cudaStream_t stream);

// Loads the kernels above now (PreloadDataPlaneKernels calls it; data_plane.h says why).
absl::Status PreloadPacketKernels();

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_PACKETS_H_
