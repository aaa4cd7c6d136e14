// The cuda_ipc link (device_link.h). Each end owns its receive buffer and one flag per chunk in
// its own GPU's memory, exported through CUDA IPC handles and mapped by the other end. A sender
// writes rows into the peer's receive buffer with a kernel (SendRows), whose last block raises the
// chunk's flag in the peer's memory; the receiver has a WaitFlag kernel queued ahead on its stream,
// spinning on that flag in its own memory. Flags only grow: a step's layer expects
// step * num_layers + layer + 1. A decode chunk of a few rows (up to LinkShape::line_rows) goes as
// lines instead (kernels/cuda/line.h), into a lines buffer that each end also exports, tagged
// LineTag of the same value: no flag, and the receiver polls the lines themselves. A chunk of more
// rows, up to LinkShape::packet_rows, goes as packets the same way (kernels/cuda/packets.h), where
// the GPUs are joined by NVLink; the memory end polls those into its receive buffer ahead of the
// attention, and sends the outputs from its own rows after it.
#include "data_plane/cuda_ipc_link.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/error_word.h"
#include "common/cuda/ipc.h"
#include "common/status/status_macros.h"
#include "common/transport/wire.h"
#include "data_plane/attention_protocol.h"
#include "data_plane/link_rows.h"
#include "kernels/cuda/data_plane.h"
#include "kernels/cuda/packets.h"

namespace lamina {
namespace {

namespace kc = kernels::cuda;

constexpr uint32_t kReceiveTimedOut = 1;
constexpr uint32_t kAborted = 2;  // Abort: the peer is gone

uint64_t FlagValue(const LinkShape& shape, uint64_t step, int64_t layer) {
  return step * static_cast<uint64_t>(shape.num_layers) + static_cast<uint64_t>(layer) + 1;
}

// InvalidArgument unless attention outputs of `q_size` floats split into `segments` equal parts
// (LinkShape::out_segments).
absl::Status CheckOutSegments(int64_t q_size, int64_t segments) {
  if (segments < 1 || q_size % segments != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc: attention outputs of ", q_size, " floats in ", segments, " equal parts"));
  }
  return absl::OkStatus();
}

// What both ends own: a receive buffer and flags (exported), a word for each chunk's SendRows to
// count its blocks, and the error word that a timed-out wait sets (common/cuda/error_word.h).
struct Local {
  cuda::DeviceBuffer receive;   // float [max_rows, row floats]
  cuda::DeviceBuffer lines;     // Line [max_chunks, line_rows, row floats / 2], zeroed (no tag is 0)
  cuda::DeviceBuffer packets;   // Packet [max_rows, PacketsPerRow(row floats, parts)] (one without packets), zeroed
  cuda::DeviceBuffer flags;     // uint64 [max_chunks], the peer raises them
  cuda::DeviceBuffer arrivals;  // uint32 [max_chunks]
  cuda::ErrorWord error;
  std::string bus_id;  // this GPU's PCI bus id (cuda::PciBusId)

  // On the current device, for rows of `row_floats`, whose packets go in `parts` parts a row.
  static absl::StatusOr<Local> Create(const LinkShape& shape, int64_t row_floats, int64_t parts) {
    LAMINA_RETURN_IF_ERROR(kc::PreloadDataPlaneKernels());
    Local l;
    LAMINA_ASSIGN_OR_RETURN(
        l.receive, cuda::DeviceBuffer::Create(std::max<int64_t>(1, shape.max_rows * row_floats) * sizeof(float)));
    LAMINA_ASSIGN_OR_RETURN(
        l.lines, cuda::DeviceBuffer::Create(std::max<int64_t>(1, shape.max_chunks * shape.line_rows * row_floats / 2) *
                                            sizeof(kc::Line)));
    const int64_t packets = shape.packet_rows > 0 ? shape.max_rows * kc::PacketsPerRow(row_floats, parts) : 1;
    LAMINA_ASSIGN_OR_RETURN(l.packets, cuda::DeviceBuffer::Create(packets * sizeof(kc::Packet)));
    LAMINA_ASSIGN_OR_RETURN(l.flags, cuda::DeviceBuffer::Create(shape.max_chunks * sizeof(uint64_t)));
    LAMINA_ASSIGN_OR_RETURN(l.arrivals, cuda::DeviceBuffer::Create(shape.max_chunks * sizeof(uint32_t)));
    LAMINA_ASSIGN_OR_RETURN(l.error, cuda::ErrorWord::Create());
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemset(l.lines.data(), 0, l.lines.bytes()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemset(l.packets.data(), 0, l.packets.bytes()));
    int device = 0;
    LAMINA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    LAMINA_ASSIGN_OR_RETURN(l.bus_id, cuda::PciBusId(device));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemset(l.flags.data(), 0, l.flags.bytes()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemset(l.arrivals.data(), 0, l.arrivals.bytes()));
    // The legacy stream: the nodes' streams are non-blocking, and other links' waits may spin.
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));
    return l;
  }

  // The shape, this GPU's bus id and the handles of the receive buffer, the lines, the packets and
  // the flags, as one message.
  absl::StatusOr<std::string> Export(const LinkShape& shape) const {
    LAMINA_ASSIGN_OR_RETURN(std::string receive_handle, cuda::ExportIpcHandle(receive.data()));
    LAMINA_ASSIGN_OR_RETURN(std::string lines_handle, cuda::ExportIpcHandle(lines.data()));
    LAMINA_ASSIGN_OR_RETURN(std::string packets_handle, cuda::ExportIpcHandle(packets.data()));
    LAMINA_ASSIGN_OR_RETURN(std::string flags_handle, cuda::ExportIpcHandle(flags.data()));
    std::vector<uint8_t> bytes;
    WireWriter w(&bytes);
    w.Put<int64_t>(shape.max_rows);
    w.Put<int32_t>(shape.max_chunks);
    w.Put<int64_t>(shape.line_rows);
    w.Put<int64_t>(shape.packet_rows);
    w.Put<int64_t>(shape.out_segments);
    w.PutString(bus_id);
    w.PutString(receive_handle);
    w.PutString(lines_handle);
    w.PutString(packets_handle);
    w.PutString(flags_handle);
    return std::string(bytes.begin(), bytes.end());
  }

  // Called once the step's work is done.
  absl::Status TakeStatus(const char* waiting_for, absl::Duration timeout) {
    LAMINA_ASSIGN_OR_RETURN(const uint32_t code, error.Take());
    if (code == 0) return absl::OkStatus();
    if (code == kAborted) {
      return absl::UnavailableError(
          absl::StrCat("cuda_ipc: the peer closed its connection while ", waiting_for, " were awaited"));
    }
    return absl::DeadlineExceededError(absl::StrCat("cuda_ipc: ", waiting_for, " did not arrive within ",
                                                    absl::FormatDuration(timeout)));
  }
};

// The most rows a link of `max_rows` rows may send as lines: what one receiving launch takes.
int64_t MostLineRows(int64_t max_rows) { return std::min(max_rows, kc::ReceiveRowsMaxCount()); }

// The peer's receive buffer, lines, packets and flags, mapped here.
struct Remote {
  cuda::IpcMapping receive;
  cuda::IpcMapping lines;
  cuda::IpcMapping packets;
  cuda::IpcMapping flags;
  int64_t line_rows = 0;    // as the peer exported them
  int64_t packet_rows = 0;  // as the peer exported them
  int64_t out_segments = 1;  // as the peer exported them
  std::string bus_id;       // the peer's GPU

  // Refuses buffers for another number of rows or chunks than `shape`'s, and outputs in parts that
  // do not divide its q_size; the line and packet rows and the parts are the caller's to check.
  static absl::StatusOr<Remote> Open(const std::string& exported, const LinkShape& shape) {
    WireReader r(reinterpret_cast<const uint8_t*>(exported.data()), exported.size());
    int64_t max_rows;
    int32_t max_chunks;
    Remote remote;
    std::string receive_handle, lines_handle, packets_handle, flags_handle;
    LAMINA_RETURN_IF_ERROR(r.Get(&max_rows));
    LAMINA_RETURN_IF_ERROR(r.Get(&max_chunks));
    LAMINA_RETURN_IF_ERROR(r.Get(&remote.line_rows));
    LAMINA_RETURN_IF_ERROR(r.Get(&remote.packet_rows));
    LAMINA_RETURN_IF_ERROR(r.Get(&remote.out_segments));
    LAMINA_RETURN_IF_ERROR(r.GetString(&remote.bus_id));
    LAMINA_RETURN_IF_ERROR(r.GetString(&receive_handle));
    LAMINA_RETURN_IF_ERROR(r.GetString(&lines_handle));
    LAMINA_RETURN_IF_ERROR(r.GetString(&packets_handle));
    LAMINA_RETURN_IF_ERROR(r.GetString(&flags_handle));
    if (max_rows != shape.max_rows || max_chunks != shape.max_chunks) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_ipc: the peer's buffers are for ", max_rows, " rows in ",
                                                     max_chunks, " chunks, not ", shape.max_rows, " in ",
                                                     shape.max_chunks));
    }
    LAMINA_RETURN_IF_ERROR(CheckOutSegments(shape.q_size, remote.out_segments));
    if (remote.line_rows < 0 || remote.line_rows > MostLineRows(max_rows)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_ipc: lines for ", remote.line_rows, " rows (0 to ", MostLineRows(max_rows), ")"));
    }
    if (remote.packet_rows < 0 || remote.packet_rows > max_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_ipc: packets for ", remote.packet_rows, " rows (0 to ", max_rows, ")"));
    }
    LAMINA_ASSIGN_OR_RETURN(remote.receive, cuda::IpcMapping::Open(receive_handle));
    LAMINA_ASSIGN_OR_RETURN(remote.lines, cuda::IpcMapping::Open(lines_handle));
    LAMINA_ASSIGN_OR_RETURN(remote.packets, cuda::IpcMapping::Open(packets_handle));
    LAMINA_ASSIGN_OR_RETURN(remote.flags, cuda::IpcMapping::Open(flags_handle));
    return remote;
  }
};

// The most rows a decode chunk that travels as lines has: none where the link has packets, and
// line_rows where it has not (GPUs not joined by NVLink): since each attention block polls and
// sends its own packets, packets are faster than lines even at 1 and 2 rows.
int64_t LineRows(const LinkShape& shape) { return shape.packet_rows > 0 ? 0 : shape.line_rows; }

// Whether a decode chunk of `rows` rows travels as lines.
bool AsLines(const LinkShape& shape, int64_t rows) { return rows >= 1 && rows <= LineRows(shape); }

// Whether a decode chunk of `rows` rows travels as packets.
bool AsPackets(const LinkShape& shape, int64_t rows) { return rows > LineRows(shape) && rows <= shape.packet_rows; }

// The packets of row `row` in a packets buffer for rows of `row_floats` in `parts` parts.
template <typename PacketT>
PacketT* RowPackets(PacketT* packets, int64_t row, int64_t row_floats, int64_t parts = 1) {
  return packets + row * kc::PacketsPerRow(row_floats, parts);
}

// Chunk `chunk`'s lines in a lines buffer for rows of `row_floats`: each chunk has line_rows rows
// of its own, wherever its rows start in the batch.
template <typename LineT>
LineT* ChunkLines(LineT* lines, const LinkShape& shape, int chunk, int64_t row_floats) {
  return lines + chunk * shape.line_rows * row_floats / 2;
}

class CudaIpcComputeEnd : public ComputeLinkEnd {
 public:
  static absl::StatusOr<std::unique_ptr<CudaIpcComputeEnd>> Create(const LinkShape& shape, int device) {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    if (shape.packet_rows < 0 || shape.packet_rows > shape.max_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_ipc: packets for ", shape.packet_rows, " rows (0 to ", shape.max_rows, ")"));
    }
    LAMINA_RETURN_IF_ERROR(CheckOutSegments(shape.q_size, shape.out_segments));
    if (shape.line_rows < 0 || shape.line_rows > MostLineRows(shape.max_rows) || shape.qkv_size % 2 != 0 ||
        shape.q_size % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_ipc: lines for ", shape.line_rows, " rows (0 to ",
                                                     MostLineRows(shape.max_rows), ") of ", shape.qkv_size, " and ",
                                                     shape.q_size, " floats (even numbers)"));
    }
    std::unique_ptr<CudaIpcComputeEnd> end(new CudaIpcComputeEnd(shape, device));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&end->sms_, cudaDevAttrMultiProcessorCount, device));
    LAMINA_ASSIGN_OR_RETURN(end->local_, Local::Create(shape, shape.q_size, shape.out_segments));
    LAMINA_ASSIGN_OR_RETURN(end->rows_, LinkRows::Create("cuda_ipc", shape.max_rows, device));
    LAMINA_ASSIGN_OR_RETURN(end->offer_, end->local_.Export(shape));
    LAMINA_ASSIGN_OR_RETURN(end->receives_, cuda::Stream::Create());
    LAMINA_ASSIGN_OR_RETURN(end->sending_, cuda::Event::CreateForOrdering());
    LAMINA_ASSIGN_OR_RETURN(end->received_, cuda::Event::CreateForOrdering());
    return end;
  }

  std::string transport() const override { return "cuda_ipc"; }
  int max_chunks() const override { return static_cast<int>(shape_.max_chunks); }
  std::string Offer() const override { return offer_; }
  absl::Status Accept(const std::string& answer) override {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    LAMINA_ASSIGN_OR_RETURN(remote_, Remote::Open(answer, shape_));
    if (remote_.line_rows != shape_.line_rows) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_ipc: the memory end took lines for ", remote_.line_rows,
                                                     " rows, not the ", shape_.line_rows, " offered"));
    }
    // The memory end takes the packets offered, or none where the GPUs are not joined by NVLink.
    if (remote_.packet_rows != 0 && remote_.packet_rows != shape_.packet_rows) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_ipc: the memory end took packets for ",
                                                     remote_.packet_rows, " rows, not the ", shape_.packet_rows,
                                                     " offered"));
    }
    shape_.packet_rows = remote_.packet_rows;
    memory_end_on_this_gpu_ = local_.bus_id == remote_.bus_id;
    if (remote_.out_segments != shape_.out_segments) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_ipc: the memory end took outputs in ",
                                                     remote_.out_segments, " parts a row, not the ",
                                                     shape_.out_segments, " offered"));
    }
    return absl::OkStatus();
  }

  absl::Status SetRows(absl::Span<const int32_t> rows) override { return rows_.Set(rows); }

  absl::Status QueueSend(uint64_t step, int64_t layer, int chunk, int chunks, const float* qkv, int64_t qkv_stride,
                         GpuStream stream) override {
    const RowRange r = ChunkOf(rows_.count(), chunks, chunk);
    if (chunks > 1 && chunk == 0) {
      // The layer's receives start after everything queued so far (they overwrite `out`).
      LAMINA_RETURN_IF_ERROR(sending_.Record(stream));
      LAMINA_RETURN_IF_ERROR(sending_.HoldUntilDone(receives_.get()));
    }
    if (AsLines(shape_, r.count)) {
      return kc::SendLines(qkv, qkv_stride, rows_.device_rows() + r.first, r.count, shape_.qkv_size,
                           ChunkLines(remote_.lines.as<kc::Line>(), shape_, chunk, shape_.qkv_size), shape_.qkv_size,
                           kc::LineTag(FlagValue(shape_, step, layer)), local_.error.get(), stream,
                           SentAt(layer));
    }
    if (AsPackets(shape_, r.count)) {
      return kc::SendPackets(qkv, qkv_stride, rows_.device_rows() + r.first, r.count, shape_.qkv_size,
                             RowPackets(remote_.packets.as<kc::Packet>(), r.first, shape_.qkv_size),
                             kc::PacketsPerRow(shape_.qkv_size), kc::LineTag(FlagValue(shape_, step, layer)),
                             local_.error.get(), stream, SentAt(layer), /*segments=*/1,
                             ReceiveStartsWithSend(chunks, r.count));
    }
    return kc::SendRows(qkv, qkv_stride, rows_.device_rows() + r.first, r.count, shape_.qkv_size,
                        remote_.receive.as<float>() + r.first * shape_.qkv_size, shape_.qkv_size,
                        remote_.flags.as<uint64_t>() + chunk, FlagValue(shape_, step, layer), local_.error.get(),
                        local_.arrivals.as<uint32_t>() + chunk, stream, SentAt(layer));
  }

  // With several chunks the receives run on a stream of their own, so that a chunk's outputs are
  // scattered into `out` while the later chunks are still being sent; `stream` waits for them
  // after the last chunk.
  absl::Status QueueReceive(uint64_t step, int64_t layer, int chunk, int chunks, float* out, int64_t out_stride,
                            GpuStream stream) override {
    if (chunks == 1) return QueueReceiveOn(step, layer, chunk, chunks, out, out_stride, stream);
    LAMINA_RETURN_IF_ERROR(QueueReceiveOn(step, layer, chunk, chunks, out, out_stride, receives_.get()));
    if (chunk + 1 < chunks) return absl::OkStatus();
    LAMINA_RETURN_IF_ERROR(received_.Record(receives_.get()));
    return received_.HoldUntilDone(stream);
  }

  absl::Status TakeStepStatus() override {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    // Normally idle by now, as the caller's stream waited for it; not after a step that failed
    // while it was being queued.
    LAMINA_RETURN_IF_ERROR(receives_.Synchronize());
    return local_.TakeStatus("attention outputs", shape_.timeout);
  }
  absl::Status Abort() override { return local_.error.Abort(kAborted); }
  absl::Status SetHopClock(uint64_t* clocks) override {
    hop_clock_ = clocks;
    return absl::OkStatus();
  }

  bool can_send_rows() const override { return true; }
  absl::Status QueueSendRows(uint64_t step, int64_t layer, const float* rows, int64_t count, int64_t stride,
                             GpuStream stream) override {
    const int64_t kv2 = shape_.qkv_size - shape_.q_size;  // k and v
    const int64_t most = attention_protocol::StoreTransferRows(shape_.max_rows, shape_.q_size, kv2 / 2);
    if (count > most) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_ipc: ", count, " rows of k/v for a link of ",
                                                     shape_.max_rows, " (at most ", most, ")"));
    }
    return kc::SendRows(rows, stride, nullptr, count, kv2, remote_.receive.as<float>(), kv2,
                        remote_.flags.as<uint64_t>(), FlagValue(shape_, step, layer), local_.error.get(),
                        local_.arrivals.as<uint32_t>(), stream);
  }
  absl::Status QueueAwait(uint64_t step, int64_t layer, GpuStream stream) override {
    return kc::WaitFlag(local_.flags.as<uint64_t>(), FlagValue(shape_, step, layer),
                        absl::ToInt64Nanoseconds(shape_.timeout), local_.error.get(), kReceiveTimedOut, stream);
  }

 private:
  CudaIpcComputeEnd(const LinkShape& shape, int device) : shape_(shape), device_(device) {}

  // The chunk's wait and scatter, on `stream`.
  absl::Status QueueReceiveOn(uint64_t step, int64_t layer, int chunk, int chunks, float* out, int64_t out_stride,
                              GpuStream stream) {
    const RowRange r = ChunkOf(rows_.count(), chunks, chunk);
    if (AsLines(shape_, r.count)) {
      return kc::ReceiveLines(ChunkLines(local_.lines.as<kc::Line>(), shape_, chunk, shape_.q_size), shape_.q_size,
                              kc::LineTag(FlagValue(shape_, step, layer)), absl::ToInt64Nanoseconds(shape_.timeout),
                              local_.error.get(), kReceiveTimedOut, rows_.device_rows() + r.first, r.count,
                              shape_.q_size, out, out_stride, stream, 0, kc::NextKernel::kStartsAtOnce,
                              BackAt(layer));
    }
    if (AsPackets(shape_, r.count)) {
      const int64_t parts = shape_.out_segments;
      return kc::ReceivePackets({RowPackets(local_.packets.as<kc::Packet>(), r.first, shape_.q_size, parts),
                                 kc::PacketsPerRow(shape_.q_size, parts), kc::LineTag(FlagValue(shape_, step, layer)),
                                 r.count, shape_.q_size, parts},
                                {absl::ToInt64Nanoseconds(shape_.timeout), local_.error.get(), kReceiveTimedOut},
                                {out, out_stride, rows_.device_rows() + r.first}, stream,
                                {BackAt(layer), MostPollingBlocks(), ReceiveStartsWithSend(chunks, r.count)});
    }
    if (r.count >= 1 && r.count <= kc::ReceiveRowsMaxCount()) {
      return kc::ReceiveRows(local_.flags.as<uint64_t>() + chunk, FlagValue(shape_, step, layer),
                             absl::ToInt64Nanoseconds(shape_.timeout), local_.error.get(), kReceiveTimedOut,
                             local_.receive.as<float>() + r.first * shape_.q_size, shape_.q_size,
                             rows_.device_rows() + r.first, r.count, shape_.q_size, out, out_stride, stream,
                             BackAt(layer));
    }
    LAMINA_RETURN_IF_ERROR(kc::WaitFlag(local_.flags.as<uint64_t>() + chunk, FlagValue(shape_, step, layer),
                                        absl::ToInt64Nanoseconds(shape_.timeout), local_.error.get(), kReceiveTimedOut,
                                        stream));
    return kc::ScatterRows(local_.receive.as<float>() + r.first * shape_.q_size, shape_.q_size,
                           rows_.device_rows() + r.first, r.count, shape_.q_size, out, out_stride, stream,
                           BackAt(layer));
  }

  // The outputs' packets are polled from the start by up to two blocks an SM of this GPU (a
  // quarter of its threads), as their hop leaves the memory node as soon as its attention ends.
  // With ReceivePackets' default of 32 blocks, a hop of 32 rows of Llama-3-8B's outputs or more
  // waits behind a warp polling the first packet, which lengthens the round trip of those sizes.
  // The default where the memory end's attention runs on this GPU too, so as to leave it SMs.
  int64_t MostPollingBlocks() const {
    return memory_end_on_this_gpu_ ? kc::kMostPacketPollingBlocks
                                   : std::max<int64_t>(kc::kMostPacketPollingBlocks, 2 * sms_);
  }

  // Whether a chunk of `rows` rows as packets, the layer's only one, has its receive start with
  // its send (ReceivePackets' starts_with_send, where it polls from the start): the GPU's turn
  // from the send's launch to the receive's then leaves the round trip, which matters where
  // another stream's kernels run beside them (a compute node's other batches): there a small
  // hop's round trip shortens by about a quarter, and alone it is unchanged.
  bool ReceiveStartsWithSend(int chunks, int64_t rows) const { return chunks == 1 && AsPackets(shape_, rows); }

  // The layer's hop clock words (SetHopClock), or null.
  uint64_t* SentAt(int64_t layer) const { return hop_clock_ != nullptr ? hop_clock_ + 2 * layer : nullptr; }
  uint64_t* BackAt(int64_t layer) const { return hop_clock_ != nullptr ? hop_clock_ + 2 * layer + 1 : nullptr; }

  LinkShape shape_;
  int device_;
  int sms_ = 1;   // the GPU's SMs
  bool memory_end_on_this_gpu_ = false;
  Local local_;   // receives attention outputs [max_rows, q_size]
  Remote remote_;
  LinkRows rows_;  // the batch row of each row sent
  std::string offer_;
  cuda::Stream receives_;          // a layer's receives, when it travels in several chunks
  cuda::Event sending_, received_;  // the layer's sends start; its receives are done
  uint64_t* hop_clock_ = nullptr;   // SetHopClock's [num_layers, 2], or null
};

class CudaIpcMemoryEnd : public MemoryLinkEnd {
 public:
  static absl::StatusOr<std::pair<std::unique_ptr<MemoryLinkEnd>, std::string>> Create(const LinkShape& shape,
                                                                                      int device,
                                                                                      const std::string& offer) {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    LAMINA_ASSIGN_OR_RETURN(Remote remote, Remote::Open(offer, shape));
    // The compute end picks how many rows travel as lines and as packets; packets only where the
    // two GPUs are one or joined by NVLink (packets.h).
    LinkShape adopted = shape;
    adopted.line_rows = remote.line_rows;
    adopted.packet_rows = cuda::SameGpuOrNvlink(device, remote.bus_id) ? remote.packet_rows : 0;
    adopted.out_segments = remote.out_segments;
    std::unique_ptr<CudaIpcMemoryEnd> end(new CudaIpcMemoryEnd(adopted));
    end->remote_ = std::move(remote);
    LAMINA_ASSIGN_OR_RETURN(end->local_, Local::Create(adopted, adopted.qkv_size, 1));
    end->sender_on_this_gpu_ = end->local_.bus_id == end->remote_.bus_id;
    LAMINA_ASSIGN_OR_RETURN(std::string answer, end->local_.Export(adopted));
    return std::make_pair(std::unique_ptr<MemoryLinkEnd>(std::move(end)), std::move(answer));
  }

  std::string transport() const override { return "cuda_ipc"; }
  const float* received() const override { return local_.receive.as<float>(); }

  // A chunk sent as lines is polled into its rows of received(); DirectHop's launch polls them
  // itself instead. So is a chunk sent as packets (the lane polls them: DeviceHop::PacketsIn).
  absl::Status QueueReceive(uint64_t step, int64_t layer, int chunk, int chunks, int64_t rows,
                            GpuStream stream) override {
    const RowRange r = ChunkOf(rows, chunks, chunk);
    if (AsLines(shape_, r.count)) {
      return kc::ReceiveLines(ChunkLines(local_.lines.as<kc::Line>(), shape_, chunk, shape_.qkv_size),
                              shape_.qkv_size, kc::LineTag(FlagValue(shape_, step, layer)),
                              absl::ToInt64Nanoseconds(shape_.timeout), local_.error.get(), kReceiveTimedOut, nullptr,
                              r.count, shape_.qkv_size, local_.receive.as<float>() + r.first * shape_.qkv_size,
                              shape_.qkv_size, stream);
    }
    if (AsPackets(shape_, r.count)) {
      return kc::ReceivePackets({RowPackets(local_.packets.as<kc::Packet>(), r.first, shape_.qkv_size),
                                 kc::PacketsPerRow(shape_.qkv_size), kc::LineTag(FlagValue(shape_, step, layer)),
                                 r.count, shape_.qkv_size},
                                {absl::ToInt64Nanoseconds(shape_.timeout), local_.error.get(), kReceiveTimedOut},
                                {local_.receive.as<float>() + r.first * shape_.qkv_size, shape_.qkv_size}, stream);
    }
    return WaitForFlag(step, layer, chunk, stream);
  }
  absl::Status QueueReceiveStore(uint64_t step, int64_t layer, int64_t count, GpuStream stream) override {
    return WaitForFlag(step, layer, 0, stream);
  }

  absl::Status QueueSend(uint64_t step, int64_t layer, int chunk, int chunks, int64_t rows, const float* out,
                         int64_t out_stride, GpuStream stream) override {
    const RowRange r = ChunkOf(rows, chunks, chunk);
    // After a wait gave up the outputs are garbage: the flag stays down (or the lines unsent) and
    // the compute end times out too.
    if (AsLines(shape_, r.count)) {
      return kc::SendLines(out + r.first * out_stride, out_stride, nullptr, r.count, shape_.q_size,
                           ChunkLines(remote_.lines.as<kc::Line>(), shape_, chunk, shape_.q_size), shape_.q_size,
                           kc::LineTag(FlagValue(shape_, step, layer)), local_.error.get(), stream);
    }
    if (AsPackets(shape_, r.count)) {
      const int64_t parts = shape_.out_segments;
      return kc::SendPackets(out + r.first * out_stride, out_stride, nullptr, r.count, shape_.q_size,
                             RowPackets(remote_.packets.as<kc::Packet>(), r.first, shape_.q_size, parts),
                             kc::PacketsPerRow(shape_.q_size, parts), kc::LineTag(FlagValue(shape_, step, layer)),
                             local_.error.get(), stream, nullptr, parts);
    }
    return kc::SendRows(out + r.first * out_stride, out_stride, nullptr, r.count, shape_.q_size,
                        remote_.receive.as<float>() + r.first * shape_.q_size, shape_.q_size,
                        remote_.flags.as<uint64_t>() + chunk, FlagValue(shape_, step, layer), local_.error.get(),
                        local_.arrivals.as<uint32_t>() + chunk, stream);
  }

  std::optional<DeviceHop> DirectHop(uint64_t step, int64_t layer, int chunk, int chunks, int64_t rows) override {
    const RowRange r = ChunkOf(rows, chunks, chunk);
    const uint64_t value = FlagValue(shape_, step, layer);
    DeviceHop hop;
    hop.timeout_ns = absl::ToInt64Nanoseconds(shape_.timeout);
    hop.error = local_.error.get();
    hop.error_code = kReceiveTimedOut;
    hop.tag = kc::LineTag(value);
    float* in_rows = local_.receive.as<float>() + r.first * shape_.qkv_size;
    float* out_rows = remote_.receive.as<float>() + r.first * shape_.q_size;
    if (AsLines(shape_, r.count)) {
      // The compute end polls the lines (ReceiveLines): a flag after them would only hold the
      // launch back while it drains them across the link.
      hop.in = DeviceHop::LinesIn{ChunkLines(local_.lines.as<kc::Line>(), shape_, chunk, shape_.qkv_size), in_rows};
      hop.out = DeviceHop::LinesOut{ChunkLines(remote_.lines.as<kc::Line>(), shape_, chunk, shape_.q_size), out_rows,
                                    shape_.q_size};
    } else if (AsPackets(shape_, r.count)) {
      hop.in = DeviceHop::PacketsIn{RowPackets(local_.packets.as<kc::Packet>(), r.first, shape_.qkv_size), in_rows,
                                    sender_on_this_gpu_};
      hop.out = DeviceHop::PacketsOut{
          RowPackets(remote_.packets.as<kc::Packet>(), r.first, shape_.q_size, shape_.out_segments),
          shape_.out_segments};
    } else {
      hop.in = DeviceHop::FlagIn{local_.flags.as<uint64_t>() + chunk, value};
      hop.out = DeviceHop::RowsOut{out_rows, shape_.q_size, remote_.flags.as<uint64_t>() + chunk, value};
    }
    return hop;
  }

  absl::Status TakeStepStatus() override { return local_.TakeStatus("q/k/v", shape_.timeout); }
  absl::Status Abort() override { return local_.error.Abort(kAborted); }

 private:
  explicit CudaIpcMemoryEnd(const LinkShape& shape) : shape_(shape) {}

  absl::Status WaitForFlag(uint64_t step, int64_t layer, int chunk, GpuStream stream) {
    return kc::WaitFlag(local_.flags.as<uint64_t>() + chunk, FlagValue(shape_, step, layer),
                        absl::ToInt64Nanoseconds(shape_.timeout), local_.error.get(), kReceiveTimedOut, stream);
  }

  LinkShape shape_;
  Local local_;  // receives q/k/v [max_rows, qkv_size]
  Remote remote_;
  bool sender_on_this_gpu_ = false;  // the compute end's GPU is this one
};

}  // namespace

absl::StatusOr<std::unique_ptr<ComputeLinkEnd>> CreateCudaIpcComputeEnd(const LinkShape& shape, int device) {
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<CudaIpcComputeEnd> end, CudaIpcComputeEnd::Create(shape, device));
  return std::unique_ptr<ComputeLinkEnd>(std::move(end));
}

absl::StatusOr<std::pair<std::unique_ptr<MemoryLinkEnd>, std::string>> CreateCudaIpcMemoryEnd(
    const LinkShape& shape, int device, const std::string& offer) {
  return CudaIpcMemoryEnd::Create(shape, device, offer);
}

}  // namespace lamina
