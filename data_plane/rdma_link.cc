// The rdma link (device_link.h): the cuda_ipc link's flags and waits, with RDMA WRITEs over an RC
// queue pair (common/rdma/queue_pair.h) in place of stores into mapped peer memory, for GPUs in
// different hosts. Each end registers its receive buffer and flags (GPU memory, GPUDirect RDMA) for
// the peer's writes, and a staging buffer for its own sends.
//
// A send is queued ahead like the others: SendRows gathers the chunk's rows into the staging buffer
// and then raises a ready word in pinned host memory. A poster thread, given the send when it was
// queued, waits for that word, posts the rows' WRITE and then the flag's WRITE (in order on the
// queue pair, so the flag lands after the rows), and awaits the flag's completion. The receiver's
// WaitFlag kernel spins on the flag in its own GPU memory. A send whose rows are never staged (its
// stream's wait gave up) is dropped after the link's timeout, and the peer's wait then gives up too.
#include "data_plane/rdma_link.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/rdma/queue_pair.h"
#include "common/status/status_macros.h"
#include "common/transport/wire.h"
#include "data_plane/link_rows.h"
#include "kernels/cuda/data_plane.h"

namespace lamina {
namespace {

namespace kc = kernels::cuda;

constexpr uint32_t kReceiveTimedOut = 1;
constexpr uint32_t kAborted = 2;                  // Abort: the peer is gone
constexpr size_t kRegionAlign = size_t{2} << 20;  // dmabuf export works on 2 MiB-aligned ranges

uint64_t FlagValue(const LinkShape& shape, uint64_t step, int64_t layer) {
  return step * static_cast<uint64_t>(shape.num_layers) + static_cast<uint64_t>(layer) + 1;
}

size_t Rounded(size_t bytes) { return (std::max<size_t>(bytes, 1) + kRegionAlign - 1) / kRegionAlign * kRegionAlign; }

// One send for the poster: once ready[chunk] >= value, the staged bytes [offset, offset + bytes)
// go to the same offset of the peer's receive buffer, then `value` to the peer's flag `chunk`.
struct Send {
  uint64_t value;
  int chunk;
  size_t offset;
  size_t bytes;
};

// Everything one end owns.
class Side {
 public:
  static absl::StatusOr<std::unique_ptr<Side>> Create(const LinkShape& shape, int device, int64_t receive_floats,
                                                      int64_t send_floats) {
    std::unique_ptr<Side> side(new Side(shape));
    // First, so that a machine without RDMA fails before touching the GPU.
    LAMINA_ASSIGN_OR_RETURN(side->qp_, rdma::QueuePair::Open(""));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    LAMINA_RETURN_IF_ERROR(kc::PreloadDataPlaneKernels());
    const int chunks = static_cast<int>(shape.max_chunks);
    LAMINA_ASSIGN_OR_RETURN(side->receive_, cuda::DeviceBuffer::Create(Rounded(receive_floats * sizeof(float))));
    LAMINA_ASSIGN_OR_RETURN(side->flags_, cuda::DeviceBuffer::Create(Rounded(chunks * sizeof(uint64_t))));
    LAMINA_ASSIGN_OR_RETURN(side->staging_, cuda::DeviceBuffer::Create(Rounded(send_floats * sizeof(float))));
    LAMINA_ASSIGN_OR_RETURN(side->arrivals_, cuda::DeviceBuffer::Create(chunks * sizeof(uint32_t)));
    // ready words [chunks], flag values [chunks], then the error word.
    LAMINA_ASSIGN_OR_RETURN(side->host_, cuda::PinnedBuffer::Create(2 * chunks * sizeof(uint64_t) + sizeof(uint64_t)));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemset(side->flags_.data(), 0, side->flags_.bytes()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemset(side->arrivals_.data(), 0, side->arrivals_.bytes()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    std::memset(side->host_.data(), 0, side->host_.bytes());
    LAMINA_ASSIGN_OR_RETURN(side->receive_mr_, side->qp_->RegisterGpu(side->receive_.data(), side->receive_.bytes()));
    LAMINA_ASSIGN_OR_RETURN(side->flags_mr_, side->qp_->RegisterGpu(side->flags_.data(), side->flags_.bytes()));
    LAMINA_ASSIGN_OR_RETURN(side->staging_mr_, side->qp_->RegisterGpu(side->staging_.data(), side->staging_.bytes()));
    LAMINA_ASSIGN_OR_RETURN(side->host_mr_, side->qp_->RegisterHost(side->host_.data(), side->host_.bytes()));
    return side;
  }

  ~Side() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    changed_.notify_all();
    if (poster_.joinable()) poster_.join();
  }

  // What the peer needs: the queue pair's endpoint, where to write rows and flags.
  std::string Describe() const {
    std::vector<uint8_t> bytes;
    WireWriter w(&bytes);
    w.Put<int64_t>(shape_.max_rows);
    w.Put<int32_t>(static_cast<int32_t>(shape_.max_chunks));
    qp_->local().Put(&w);
    receive_mr_.remote().Put(&w);
    flags_mr_.remote().Put(&w);
    return std::string(bytes.begin(), bytes.end());
  }

  // Connects to the peer that `description` describes and starts posting.
  absl::Status Join(const std::string& description) {
    WireReader r(reinterpret_cast<const uint8_t*>(description.data()), description.size());
    int64_t max_rows;
    int32_t max_chunks;
    rdma::Endpoint peer;
    LAMINA_RETURN_IF_ERROR(r.Get(&max_rows));
    LAMINA_RETURN_IF_ERROR(r.Get(&max_chunks));
    LAMINA_RETURN_IF_ERROR(peer.Get(&r));
    LAMINA_RETURN_IF_ERROR(peer_receive_.Get(&r));
    LAMINA_RETURN_IF_ERROR(peer_flags_.Get(&r));
    if (max_rows != shape_.max_rows || max_chunks != shape_.max_chunks) {
      return absl::InvalidArgumentError(absl::StrCat("rdma: the peer's buffers are for ", max_rows, " rows in ",
                                                     max_chunks, " chunks, not ", shape_.max_rows, " in ",
                                                     shape_.max_chunks));
    }
    LAMINA_RETURN_IF_ERROR(qp_->Connect(peer));
    poster_ = std::thread([this] { Post(); });
    return absl::OkStatus();
  }

  // Queues a send of rows [first, first + count) (of `row_floats` each) of `src` (`rows[i]` of it,
  // or row i when `rows` is null) as chunk `chunk` of layer `layer` of step `step`.
  absl::Status QueueSend(uint64_t step, int64_t layer, int chunk, const float* src, int64_t src_stride,
                         const int32_t* rows, int64_t first, int64_t count, int64_t row_floats, cudaStream_t stream) {
    const uint64_t value = FlagValue(shape_, step, layer);
    LAMINA_RETURN_IF_ERROR(kc::SendRows(src, src_stride, rows, count, row_floats,
                                        staging_.as<float>() + first * row_floats, row_floats, ready() + chunk, value,
                                        error(), arrivals_.as<uint32_t>() + chunk, stream));
    {
      std::lock_guard<std::mutex> lock(mu_);
      sends_.push_back({value, chunk, static_cast<size_t>(first * row_floats) * sizeof(float),
                        static_cast<size_t>(count * row_floats) * sizeof(float)});
    }
    changed_.notify_all();
    return absl::OkStatus();
  }

  absl::Status QueueWait(uint64_t step, int64_t layer, int chunk, cudaStream_t stream) {
    return kc::WaitFlag(flags_.as<uint64_t>() + chunk, FlagValue(shape_, step, layer),
                        absl::ToInt64Nanoseconds(shape_.timeout), error(), kReceiveTimedOut, stream);
  }

  const float* received() const { return receive_.as<float>(); }

  absl::Status TakeStatus(const char* waiting_for) {
    volatile uint32_t* e = error();
    absl::Status status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      status = std::exchange(poster_status_, absl::OkStatus());
    }
    if (*e == kAborted) {
      status = absl::UnavailableError(
          absl::StrCat("rdma: the peer closed its connection while ", waiting_for, " were awaited"));
    } else if (*e != 0 && status.ok()) {
      status = absl::DeadlineExceededError(
          absl::StrCat("rdma: ", waiting_for, " did not arrive within ", absl::FormatDuration(shape_.timeout)));
    }
    *e = 0;
    return status;
  }

  // Any thread: sets the error word (host memory), so that every wait on it, and the poster's wait
  // for staged rows, gives up.
  void Abort() {
    volatile uint32_t* e = error();
    *e = kAborted;
  }

 private:
  explicit Side(const LinkShape& shape) : shape_(shape) {}

  uint64_t* ready() const { return host_.as<uint64_t>(); }
  uint64_t* flag_values() const { return host_.as<uint64_t>() + shape_.max_chunks; }
  uint32_t* error() const { return reinterpret_cast<uint32_t*>(host_.as<uint64_t>() + 2 * shape_.max_chunks); }

  void Post() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      changed_.wait(lock, [this] { return stopping_ || !sends_.empty(); });
      if (stopping_) return;
      const Send send = sends_.front();
      sends_.pop_front();
      lock.unlock();
      absl::Status posted = PostOne(send);
      lock.lock();
      if (!posted.ok() && poster_status_.ok()) poster_status_ = posted;
    }
  }

  absl::Status PostOne(const Send& send) {
    volatile uint64_t* ready_word = ready() + send.chunk;
    const absl::Time give_up = absl::Now() + shape_.timeout;
    volatile uint32_t* e = error();
    while (*ready_word < send.value) {
      if (*e == kAborted) return absl::UnavailableError("rdma: the peer closed its connection");
      if (absl::Now() > give_up) {
        return absl::DeadlineExceededError(absl::StrCat("rdma: rows to send were not staged within ",
                                                        absl::FormatDuration(shape_.timeout)));
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return absl::CancelledError("rdma: link closed");
    }
    flag_values()[send.chunk] = send.value;
    LAMINA_RETURN_IF_ERROR(qp_->Write(staging_mr_, staging_.as<uint8_t>() + send.offset, send.bytes, peer_receive_,
                                      send.offset, false));
    LAMINA_RETURN_IF_ERROR(qp_->Write(host_mr_, flag_values() + send.chunk, sizeof(uint64_t), peer_flags_,
                                      send.chunk * sizeof(uint64_t), true));
    return qp_->AwaitCompletion(shape_.timeout);
  }

  const LinkShape shape_;
  std::unique_ptr<rdma::QueuePair> qp_;
  cuda::DeviceBuffer receive_, flags_, staging_, arrivals_;
  cuda::PinnedBuffer host_;
  rdma::MemoryRegion receive_mr_, flags_mr_, staging_mr_, host_mr_;
  rdma::RemoteBuffer peer_receive_, peer_flags_;

  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Send> sends_ ABSL_GUARDED_BY(mu_);
  absl::Status poster_status_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread poster_;
};

class RdmaComputeEnd : public ComputeLinkEnd {
 public:
  static absl::StatusOr<std::unique_ptr<RdmaComputeEnd>> Create(const LinkShape& shape, int device) {
    std::unique_ptr<RdmaComputeEnd> end(new RdmaComputeEnd(shape, device));
    LAMINA_ASSIGN_OR_RETURN(end->side_, Side::Create(shape, device, shape.max_rows * shape.q_size,
                                                     shape.max_rows * shape.qkv_size));
    LAMINA_ASSIGN_OR_RETURN(end->rows_, LinkRows::Create("rdma", shape.max_rows, device));
    return end;
  }

  std::string transport() const override { return "rdma"; }
  int max_chunks() const override { return static_cast<int>(shape_.max_chunks); }
  std::string Offer() const override { return side_->Describe(); }
  absl::Status Accept(const std::string& answer) override {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return side_->Join(answer);
  }

  absl::Status SetRows(absl::Span<const int32_t> rows) override { return rows_.Set(rows); }

  absl::Status QueueSend(uint64_t step, int64_t layer, int chunk, int chunks, const float* qkv, int64_t qkv_stride,
                         GpuStream stream) override {
    const RowRange r = ChunkOf(rows_.count(), chunks, chunk);
    return side_->QueueSend(step, layer, chunk, qkv, qkv_stride, rows_.device_rows() + r.first, r.first, r.count,
                            shape_.qkv_size, stream);
  }

  absl::Status QueueReceive(uint64_t step, int64_t layer, int chunk, int chunks, float* out, int64_t out_stride,
                            GpuStream stream) override {
    const RowRange r = ChunkOf(rows_.count(), chunks, chunk);
    LAMINA_RETURN_IF_ERROR(side_->QueueWait(step, layer, chunk, stream));
    return kc::ScatterRows(side_->received() + r.first * shape_.q_size, shape_.q_size, rows_.device_rows() + r.first,
                           r.count, shape_.q_size, out, out_stride, stream);
  }

  absl::Status TakeStepStatus() override { return side_->TakeStatus("attention outputs"); }
  absl::Status Abort() override {
    side_->Abort();
    return absl::OkStatus();
  }

 private:
  RdmaComputeEnd(const LinkShape& shape, int device) : shape_(shape), device_(device) {}

  LinkShape shape_;
  int device_;
  std::unique_ptr<Side> side_;  // receives attention outputs [max_rows, q_size]
  LinkRows rows_;  // the batch row of each row sent
};

class RdmaMemoryEnd : public MemoryLinkEnd {
 public:
  static absl::StatusOr<std::pair<std::unique_ptr<MemoryLinkEnd>, std::string>> Create(const LinkShape& shape,
                                                                                      int device,
                                                                                      const std::string& offer) {
    std::unique_ptr<RdmaMemoryEnd> end(new RdmaMemoryEnd(shape));
    LAMINA_ASSIGN_OR_RETURN(end->side_, Side::Create(shape, device, shape.max_rows * shape.qkv_size,
                                                     shape.max_rows * shape.q_size));
    LAMINA_RETURN_IF_ERROR(end->side_->Join(offer));
    std::string answer = end->side_->Describe();
    return std::make_pair(std::unique_ptr<MemoryLinkEnd>(std::move(end)), std::move(answer));
  }

  std::string transport() const override { return "rdma"; }
  const float* received() const override { return side_->received(); }

  absl::Status QueueReceive(uint64_t step, int64_t layer, int chunk, int chunks, int64_t rows,
                            GpuStream stream) override {
    return side_->QueueWait(step, layer, chunk, stream);
  }

  absl::Status QueueSend(uint64_t step, int64_t layer, int chunk, int chunks, int64_t rows, const float* out,
                         int64_t out_stride, GpuStream stream) override {
    const RowRange r = ChunkOf(rows, chunks, chunk);
    return side_->QueueSend(step, layer, chunk, out + r.first * out_stride, out_stride, nullptr, r.first, r.count,
                            shape_.q_size, stream);
  }

  absl::Status TakeStepStatus() override { return side_->TakeStatus("q/k/v"); }
  absl::Status Abort() override {
    side_->Abort();
    return absl::OkStatus();
  }

 private:
  explicit RdmaMemoryEnd(const LinkShape& shape) : shape_(shape) {}

  LinkShape shape_;
  std::unique_ptr<Side> side_;  // receives q/k/v [max_rows, qkv_size]
};

}  // namespace

absl::StatusOr<std::unique_ptr<ComputeLinkEnd>> CreateRdmaComputeEnd(const LinkShape& shape, int device) {
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<RdmaComputeEnd> end, RdmaComputeEnd::Create(shape, device));
  return std::unique_ptr<ComputeLinkEnd>(std::move(end));
}

absl::StatusOr<std::pair<std::unique_ptr<MemoryLinkEnd>, std::string>> CreateRdmaMemoryEnd(
    const LinkShape& shape, int device, const std::string& offer) {
  return RdmaMemoryEnd::Create(shape, device, offer);
}

}  // namespace lamina
