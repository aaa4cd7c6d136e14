// The nccl link (device_link.h). The two ends share a two-rank NCCL communicator (PeerComm): the
// compute end makes its id and sends it with its offer, the memory end joins as rank 1 in the
// background and answers at once, and the compute end waits for the join in Accept. Each chunk is
// one ncclSend matched by one ncclRecv. The watchdog times each exchange on the compute end and each
// step on the memory end. The compute end gathers a chunk's batch rows into a
// contiguous buffer before sending and scatters the outputs back into their rows after receiving;
// the memory end receives straight into received() and sends its outputs where they lie.
//
// The compute end sends and receives on a stream of its own, joined to the caller's by events: a
// compute node queues its exchanges with every memory node on one stream, and a dead node's
// exchange, which waits until its watchdog aborts it, must not hold up the others' behind it.
//
// A send may wait for the peer's matching receive, so a layer travels in one chunk: with several,
// the compute end's second send could wait on the memory end's second receive while that end's
// first send waits on the compute end's first receive. A dead peer fails the step with
// DeadlineExceeded once the watchdog gives up.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/nccl/peer_comm.h"
#include "common/status/status_macros.h"
#include "common/transport/wire.h"
#include "data_plane/link_rows.h"
#include "data_plane/nccl_link.h"
#include "kernels/cuda/data_plane.h"

namespace lamina {
namespace {

namespace kc = kernels::cuda;

absl::StatusOr<std::string> GpuUuid(int device) {
  cudaDeviceProp properties;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, device));
  return std::string(properties.uuid.bytes, sizeof(properties.uuid.bytes));
}

// NCCL probes the machine as a communicator forms, which can take seconds the first time.
absl::Duration JoinTimeout(const LinkShape& shape) { return std::max(shape.timeout, absl::Seconds(60)); }

absl::Status OneChunk(int chunks) {
  if (chunks == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("nccl: a layer travels in one chunk, not ", chunks));
}

class NcclComputeEnd : public ComputeLinkEnd {
 public:
  static absl::StatusOr<std::unique_ptr<NcclComputeEnd>> Create(const LinkShape& shape, int device) {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    LAMINA_RETURN_IF_ERROR(kc::PreloadDataPlaneKernels());
    std::unique_ptr<NcclComputeEnd> end(new NcclComputeEnd(shape, device));
    const int64_t rows = std::max<int64_t>(1, shape.max_rows);
    LAMINA_ASSIGN_OR_RETURN(end->send_, cuda::DeviceBuffer::Create(rows * shape.qkv_size * sizeof(float)));
    LAMINA_ASSIGN_OR_RETURN(end->receive_, cuda::DeviceBuffer::Create(rows * shape.q_size * sizeof(float)));
    LAMINA_ASSIGN_OR_RETURN(end->rows_, LinkRows::Create("nccl", shape.max_rows, device));
    LAMINA_ASSIGN_OR_RETURN(end->stream_, cuda::Stream::Create());
    LAMINA_ASSIGN_OR_RETURN(end->gathered_, cuda::Event::Create());
    LAMINA_ASSIGN_OR_RETURN(end->arrived_, cuda::Event::Create());
    LAMINA_ASSIGN_OR_RETURN(end->id_, nccl::NewCommId());
    LAMINA_ASSIGN_OR_RETURN(std::string uuid, GpuUuid(device));
    std::vector<uint8_t> bytes;
    WireWriter w(&bytes);
    w.PutString(end->id_);
    w.PutString(uuid);
    w.Put<int64_t>(shape.max_rows);
    end->offer_.assign(bytes.begin(), bytes.end());
    return end;
  }

  std::string transport() const override { return "nccl"; }
  int max_chunks() const override { return 1; }
  std::string Offer() const override { return offer_; }

  absl::Status Accept(const std::string& answer) override {
    LAMINA_ASSIGN_OR_RETURN(comm_, nccl::PeerComm::Start(id_, 0, device_, JoinTimeout(shape_), shape_.timeout));
    return comm_->AwaitReady();
  }

  absl::Status SetRows(absl::Span<const int32_t> rows) override { return rows_.Set(rows); }

  absl::Status QueueSend(uint64_t step, int64_t layer, int chunk, int chunks, const float* qkv, int64_t qkv_stride,
                         GpuStream stream) override {
    LAMINA_RETURN_IF_ERROR(OneChunk(chunks));
    float* packed = send_.as<float>();
    LAMINA_RETURN_IF_ERROR(kc::GatherRows(qkv, qkv_stride, rows_.device_rows(), rows_.count(), shape_.qkv_size, packed,
                                          shape_.qkv_size, stream));
    LAMINA_RETURN_IF_ERROR(gathered_.Record(stream));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_.get(), gathered_.get(), 0));
    // The watchdog times the exchange from here, not the wait for the caller's stream before it.
    LAMINA_RETURN_IF_ERROR(comm_->BeginWatch(stream_.get()));
    return comm_->Send(packed, rows_.count() * shape_.qkv_size, stream_.get());
  }

  absl::Status QueueReceive(uint64_t step, int64_t layer, int chunk, int chunks, float* out, int64_t out_stride,
                            GpuStream stream) override {
    LAMINA_RETURN_IF_ERROR(OneChunk(chunks));
    LAMINA_RETURN_IF_ERROR(comm_->Recv(receive_.as<float>(), rows_.count() * shape_.q_size, stream_.get()));
    LAMINA_RETURN_IF_ERROR(comm_->EndWatch(stream_.get()));
    LAMINA_RETURN_IF_ERROR(arrived_.Record(stream_.get()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, arrived_.get(), 0));
    return kc::ScatterRows(receive_.as<float>(), shape_.q_size, rows_.device_rows(), rows_.count(), shape_.q_size, out,
                           out_stride, stream);
  }

  absl::Status TakeStepStatus() override { return comm_ ? comm_->health() : absl::OkStatus(); }
  absl::Status Abort() override {
    if (comm_) comm_->Abort(absl::UnavailableError("nccl: the memory node closed its connection"));
    return absl::OkStatus();
  }

 private:
  NcclComputeEnd(const LinkShape& shape, int device) : shape_(shape), device_(device) {}

  LinkShape shape_;
  int device_;
  std::string id_;
  std::string offer_;
  cuda::DeviceBuffer send_;     // float [max_rows, qkv_size]: the rows sent, packed
  cuda::DeviceBuffer receive_;  // float [max_rows, q_size]: the outputs received, packed
  LinkRows rows_;  // the batch row of each row sent
  cuda::Stream stream_;   // the exchanges'
  cuda::Event gathered_;  // on the caller's stream: the rows are packed
  cuda::Event arrived_;   // on stream_: the outputs are in receive_
  // Last, so destroyed first: the abort ends queued exchanges before their buffers are freed.
  std::unique_ptr<nccl::PeerComm> comm_;
};

class NcclMemoryEnd : public MemoryLinkEnd {
 public:
  static absl::StatusOr<std::pair<std::unique_ptr<MemoryLinkEnd>, std::string>> Create(const LinkShape& shape,
                                                                                      int device,
                                                                                      const std::string& offer) {
    WireReader r(reinterpret_cast<const uint8_t*>(offer.data()), offer.size());
    std::string id, peer_uuid;
    int64_t max_rows;
    LAMINA_RETURN_IF_ERROR(r.GetString(&id));
    LAMINA_RETURN_IF_ERROR(r.GetString(&peer_uuid));
    LAMINA_RETURN_IF_ERROR(r.Get(&max_rows));
    if (max_rows != shape.max_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl: the compute end sends up to ", max_rows, " rows, not ", shape.max_rows));
    }
    LAMINA_ASSIGN_OR_RETURN(std::string uuid, GpuUuid(device));
    if (uuid == peer_uuid) {
      // NCCL may hang with both ranks on one GPU.
      return absl::FailedPreconditionError(absl::StrCat("nccl: the compute node and this memory node share GPU ",
                                                        device, "; NCCL joins two GPUs"));
    }
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    std::unique_ptr<NcclMemoryEnd> end(new NcclMemoryEnd(shape));
    LAMINA_ASSIGN_OR_RETURN(end->receive_, cuda::DeviceBuffer::Create(std::max<int64_t>(1, shape.max_rows) *
                                                                      shape.qkv_size * sizeof(float)));
    LAMINA_ASSIGN_OR_RETURN(end->comm_, nccl::PeerComm::Start(id, 1, device, JoinTimeout(shape), shape.timeout));
    return std::make_pair(std::unique_ptr<MemoryLinkEnd>(std::move(end)), std::string());
  }

  std::string transport() const override { return "nccl"; }
  const float* received() const override { return receive_.as<float>(); }
  void SetStepLayers(int64_t first, int64_t last) override {
    first_layer_ = first;
    last_layer_ = last;
  }

  absl::Status QueueReceive(uint64_t step, int64_t layer, int chunk, int chunks, int64_t rows,
                            GpuStream stream) override {
    LAMINA_RETURN_IF_ERROR(OneChunk(chunks));
    if (rows > shape_.max_rows) {
      return absl::InvalidArgumentError(absl::StrCat("nccl: ", rows, " rows for a link of ", shape_.max_rows));
    }
    // The join finishes in the background; the first step waits for it.
    LAMINA_RETURN_IF_ERROR(comm_->AwaitReady());
    // The watchdog times the whole step, from when this node's stream reaches it.
    if (layer == first_layer_ && chunk == 0) LAMINA_RETURN_IF_ERROR(comm_->BeginWatch(stream));
    return comm_->Recv(receive_.as<float>(), rows * shape_.qkv_size, stream);
  }

  absl::Status QueueSend(uint64_t step, int64_t layer, int chunk, int chunks, int64_t rows, const float* out,
                         int64_t out_stride, GpuStream stream) override {
    LAMINA_RETURN_IF_ERROR(OneChunk(chunks));
    if (out_stride != shape_.q_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl: outputs sent as they lie need a row stride of ", shape_.q_size, ", not ", out_stride));
    }
    LAMINA_RETURN_IF_ERROR(comm_->Send(out, rows * shape_.q_size, stream));
    if (layer == last_layer_ && chunk == chunks - 1) return comm_->EndWatch(stream);
    return absl::OkStatus();
  }

  absl::Status TakeStepStatus() override { return comm_->health(); }
  absl::Status Abort() override {
    comm_->Abort(absl::UnavailableError("nccl: the compute node closed its connection"));
    return absl::OkStatus();
  }

 private:
  explicit NcclMemoryEnd(const LinkShape& shape) : shape_(shape), last_layer_(shape.num_layers - 1) {}

  LinkShape shape_;
  int64_t first_layer_ = 0;  // the step's (SetStepLayers): the watchdog times it from the first
  int64_t last_layer_;       // receive to the last send
  cuda::DeviceBuffer receive_;  // float [max_rows, qkv_size]
  std::unique_ptr<nccl::PeerComm> comm_;  // destroyed first, as above
};

}  // namespace

absl::StatusOr<std::unique_ptr<ComputeLinkEnd>> CreateNcclComputeEnd(const LinkShape& shape, int device) {
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<NcclComputeEnd> end, NcclComputeEnd::Create(shape, device));
  return std::unique_ptr<ComputeLinkEnd>(std::move(end));
}

absl::StatusOr<std::pair<std::unique_ptr<MemoryLinkEnd>, std::string>> CreateNcclMemoryEnd(
    const LinkShape& shape, int device, const std::string& offer) {
  return NcclMemoryEnd::Create(shape, device, offer);
}

}  // namespace lamina
