#include "compute_node/rotation/device_handoff.h"

#if LAMINA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/error_word.h"
#include "common/cuda/ipc.h"
#include "common/status/status_macros.h"
#include "common/transport/wire.h"
#include "kernels/cuda/data_plane.h"
#endif

namespace lamina {

#if LAMINA_HAVE_CUDA
namespace {

namespace kc = kernels::cuda;

constexpr uint32_t kHandoverTimedOut = 1;
constexpr uint32_t kHandoverAborted = 2;  // Abort: the sender is gone

uint64_t ResidualValue(uint64_t value) { return 2 * value + 1; }
uint64_t AttnOutValue(uint64_t value) { return 2 * value + 2; }

absl::Status CheckRows(int64_t rows, const HandoffShape& shape) {
  if (rows < 1 || rows > shape.max_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("a hand-over of ", rows, " rows; the compute nodes' buffers hold 1 to ", shape.max_rows));
  }
  return absl::OkStatus();
}

class CudaDeviceInbox : public DeviceInbox {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceInbox>> Create(const HandoffShape& shape, int device) {
    if (shape.max_rows < 1 || shape.hidden < 1 || shape.q_size < 1) {
      return absl::InvalidArgumentError("a device hand-over needs rows, hidden and q sizes of at least 1");
    }
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    LAMINA_RETURN_IF_ERROR(kc::PreloadDataPlaneKernels());
    std::unique_ptr<CudaDeviceInbox> inbox(new CudaDeviceInbox(shape, device));
    LAMINA_ASSIGN_OR_RETURN(inbox->residual_,
                            cuda::DeviceBuffer::Create(shape.max_rows * shape.hidden * sizeof(float)));
    LAMINA_ASSIGN_OR_RETURN(inbox->attn_out_,
                            cuda::DeviceBuffer::Create(shape.max_rows * shape.q_size * sizeof(float)));
    LAMINA_ASSIGN_OR_RETURN(inbox->flag_, cuda::DeviceBuffer::Create(sizeof(uint64_t)));
    LAMINA_ASSIGN_OR_RETURN(inbox->error_, cuda::ErrorWord::Create());
    LAMINA_RETURN_IF_ERROR(inbox->Reset());
    std::vector<uint8_t> bytes;
    WireWriter w(&bytes);
    w.Put<int64_t>(shape.max_rows);
    w.Put<int64_t>(shape.hidden);
    w.Put<int64_t>(shape.q_size);
    for (const cuda::DeviceBuffer* buffer : {&inbox->residual_, &inbox->attn_out_, &inbox->flag_}) {
      LAMINA_ASSIGN_OR_RETURN(std::string handle, cuda::ExportIpcHandle(buffer->data()));
      w.PutString(handle);
    }
    inbox->offer_.assign(bytes.begin(), bytes.end());
    return std::unique_ptr<DeviceInbox>(std::move(inbox));
  }

  const std::string& Offer() const override { return offer_; }

  absl::Status QueueReceive(uint64_t value, int64_t rows, float* residual, float* attn_out,
                            CUstream_st* stream) override {
    LAMINA_RETURN_IF_ERROR(CheckRows(rows, shape_));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    LAMINA_RETURN_IF_ERROR(kc::WaitFlagEquals(flag_.as<uint64_t>(), AttnOutValue(value),
                                              absl::ToInt64Nanoseconds(shape_.timeout), error_.get(), kHandoverTimedOut,
                                              stream));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(residual, residual_.data(), rows * shape_.hidden * sizeof(float),
                                                cudaMemcpyDeviceToDevice, stream));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(attn_out, attn_out_.data(), rows * shape_.q_size * sizeof(float),
                                                cudaMemcpyDeviceToDevice, stream));
    return absl::OkStatus();
  }

  absl::Status TakeStatus() override {
    LAMINA_ASSIGN_OR_RETURN(const uint32_t code, error_.Take());
    if (code == 0) return absl::OkStatus();
    if (code == kHandoverAborted) return absl::UnavailableError("the sender closed its connection mid-step");
    return absl::DeadlineExceededError(
        absl::StrCat("the batch was not handed over within ", absl::FormatDuration(shape_.timeout)));
  }

  absl::Status Abort() override { return error_.Abort(kHandoverAborted); }

  absl::Status Reset() override {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    // On the legacy default stream, which does not wait for the nodes' (non-blocking) streams:
    // their waits may spin meanwhile.
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flag_.data(), 0, sizeof(uint64_t), nullptr));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));
    return error_.Take().status();
  }

 private:
  CudaDeviceInbox(const HandoffShape& shape, int device) : shape_(shape), device_(device) {}

  HandoffShape shape_;
  int device_;
  cuda::DeviceBuffer residual_;  // float [max_rows, hidden]
  cuda::DeviceBuffer attn_out_;  // float [max_rows, q_size]
  cuda::DeviceBuffer flag_;      // uint64, raised by the sender
  cuda::ErrorWord error_;        // set by a wait that gave up, or by Abort
  std::string offer_;
};

class CudaDeviceOutlet : public DeviceOutlet {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceOutlet>> Open(const HandoffShape& shape, int device,
                                                            const std::string& offer) {
    WireReader r(reinterpret_cast<const uint8_t*>(offer.data()), offer.size());
    int64_t max_rows, hidden, q_size;
    LAMINA_RETURN_IF_ERROR(r.Get(&max_rows));
    LAMINA_RETURN_IF_ERROR(r.Get(&hidden));
    LAMINA_RETURN_IF_ERROR(r.Get(&q_size));
    if (max_rows != shape.max_rows || hidden != shape.hidden || q_size != shape.q_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the next compute node's hand-over buffers are for ", max_rows, " rows of ", hidden, " + ", q_size,
          " floats, not ", shape.max_rows, " of ", shape.hidden, " + ", shape.q_size, ": do both read the same "
          "topology and model?"));
    }
    std::string handles[3];
    for (std::string& handle : handles) LAMINA_RETURN_IF_ERROR(r.GetString(&handle));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    LAMINA_RETURN_IF_ERROR(kc::PreloadDataPlaneKernels());
    std::unique_ptr<CudaDeviceOutlet> outlet(new CudaDeviceOutlet(shape, device));
    LAMINA_ASSIGN_OR_RETURN(outlet->residual_, cuda::IpcMapping::Open(handles[0]));
    LAMINA_ASSIGN_OR_RETURN(outlet->attn_out_, cuda::IpcMapping::Open(handles[1]));
    LAMINA_ASSIGN_OR_RETURN(outlet->flag_, cuda::IpcMapping::Open(handles[2]));
    LAMINA_ASSIGN_OR_RETURN(outlet->arrivals_, cuda::DeviceBuffer::Create(sizeof(uint32_t)));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(outlet->arrivals_.data(), 0, sizeof(uint32_t), nullptr));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));
    return std::unique_ptr<DeviceOutlet>(std::move(outlet));
  }

  absl::Status QueueSendResidual(uint64_t value, const float* residual, int64_t rows, CUstream_st* stream) override {
    return Send(residual, rows, shape_.hidden, residual_.as<float>(), ResidualValue(value), stream);
  }
  absl::Status QueueSendAttnOut(uint64_t value, const float* attn_out, int64_t rows, CUstream_st* stream) override {
    return Send(attn_out, rows, shape_.q_size, attn_out_.as<float>(), AttnOutValue(value), stream);
  }

 private:
  CudaDeviceOutlet(const HandoffShape& shape, int device) : shape_(shape), device_(device) {}

  absl::Status Send(const float* src, int64_t rows, int64_t cols, float* dst, uint64_t flag_value,
                    CUstream_st* stream) {
    LAMINA_RETURN_IF_ERROR(CheckRows(rows, shape_));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return kc::SendRows(src, cols, nullptr, rows, cols, dst, cols, flag_.as<uint64_t>(), flag_value, nullptr,
                        arrivals_.as<uint32_t>(), stream);
  }

  HandoffShape shape_;
  int device_;
  cuda::IpcMapping residual_;  // the next node's inbox
  cuda::IpcMapping attn_out_;
  cuda::IpcMapping flag_;
  cuda::DeviceBuffer arrivals_;  // uint32, for SendRows
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceInbox>> CreateDeviceInbox(const HandoffShape& shape, int device) {
  return CudaDeviceInbox::Create(shape, device);
}

absl::StatusOr<std::unique_ptr<DeviceOutlet>> OpenDeviceOutlet(const HandoffShape& shape, int device,
                                                               const std::string& offer) {
  return CudaDeviceOutlet::Open(shape, device, offer);
}

#else  // !LAMINA_HAVE_CUDA

absl::StatusOr<std::unique_ptr<DeviceInbox>> CreateDeviceInbox(const HandoffShape&, int) {
  return absl::FailedPreconditionError("device hand-overs: this build has no CUDA");
}

absl::StatusOr<std::unique_ptr<DeviceOutlet>> OpenDeviceOutlet(const HandoffShape&, int, const std::string&) {
  return absl::FailedPreconditionError("device hand-overs: this build has no CUDA");
}

#endif

}  // namespace lamina
