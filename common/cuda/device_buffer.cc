#include "common/cuda/device_buffer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"

namespace lamina::cuda {

absl::StatusOr<DeviceBuffer> DeviceBuffer::Create(size_t bytes) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  void* p = nullptr;
  const cudaError_t error = cudaMalloc(&p, bytes);
  if (error != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are unaffected
    return CudaStatus(error, absl::StrCat("cudaMalloc of ", bytes, " bytes").c_str(), "DeviceBuffer::Create");
  }
  buffer.data_.reset(p);
  buffer.bytes_ = bytes;
  return buffer;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::CreateZeroed(size_t bytes) {
  absl::StatusOr<DeviceBuffer> buffer = Create(bytes);
  if (!buffer.ok() || bytes == 0) return buffer;
  const cudaError_t error = cudaMemset(buffer->data(), 0, bytes);
  if (error != cudaSuccess) return CudaStatus(error, "cudaMemset", "DeviceBuffer::CreateZeroed");
  return buffer;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::CreateOnStream(size_t bytes, cudaStream_t stream) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  void* p = nullptr;
  const cudaError_t error = cudaMallocAsync(&p, bytes, stream);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(error, absl::StrCat("cudaMallocAsync of ", bytes, " bytes").c_str(),
                      "DeviceBuffer::CreateOnStream");
  }
  buffer.data_ = std::unique_ptr<void, Free>(p, Free(stream));
  buffer.bytes_ = bytes;
  return buffer;
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Create(size_t bytes) {
  PinnedBuffer buffer;
  if (bytes == 0) return buffer;
  void* p = nullptr;
  const cudaError_t error = cudaMallocHost(&p, bytes);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(error, absl::StrCat("cudaMallocHost of ", bytes, " bytes").c_str(), "PinnedBuffer::Create");
  }
  buffer.data_.reset(p);
  buffer.bytes_ = bytes;
  return buffer;
}

absl::StatusOr<Stream> Stream::Create() {
  cudaStream_t s = nullptr;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Stream stream;
  stream.stream_.reset(s);
  return stream;
}

absl::Status Stream::Synchronize() const {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  return absl::OkStatus();
}

absl::StatusOr<Event> Event::CreateWithFlags(unsigned flags) {
  cudaEvent_t e = nullptr;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, flags));
  Event event;
  event.event_.reset(e);
  return event;
}

absl::StatusOr<Event> Event::Create() { return CreateWithFlags(cudaEventDefault); }

absl::StatusOr<Event> Event::CreateForOrdering() { return CreateWithFlags(cudaEventDisableTiming); }

absl::Status Event::HoldUntilDone(cudaStream_t stream) const {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, event_.get(), 0));
  return absl::OkStatus();
}

absl::Status Event::Record(cudaStream_t stream) const {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_.get(), stream));
  return absl::OkStatus();
}

absl::StatusOr<float> Event::ElapsedSince(const Event& start) const {
  float ms = 0;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), event_.get()));
  return ms;
}

absl::Status EnsureCapacity(DeviceBuffer* buffer, size_t bytes) {
  if (buffer->bytes() >= bytes) return absl::OkStatus();
  *buffer = DeviceBuffer();  // free first so the old and new never coexist
  auto grown = DeviceBuffer::Create(bytes);
  if (!grown.ok()) return grown.status();
  *buffer = std::move(*grown);
  return absl::OkStatus();
}

absl::Status EnsureCapacityOnStream(DeviceBuffer* buffer, size_t bytes, cudaStream_t stream) {
  if (buffer->bytes() >= bytes) return absl::OkStatus();
  *buffer = DeviceBuffer();  // freed in stream order, before the new one is allocated
  auto grown = DeviceBuffer::CreateOnStream(bytes, stream);
  if (!grown.ok()) return grown.status();
  *buffer = std::move(*grown);
  return absl::OkStatus();
}

absl::Status EnsureCapacityKeepingOld(PinnedBuffer* buffer, size_t bytes, std::vector<PinnedBuffer>* retired) {
  if (buffer->bytes() >= bytes) return absl::OkStatus();
  auto grown = PinnedBuffer::Create(std::max(bytes, 2 * buffer->bytes()));
  if (!grown.ok()) return grown.status();
  if (buffer->bytes() > 0) retired->push_back(std::move(*buffer));
  *buffer = std::move(*grown);
  return absl::OkStatus();
}

absl::Status EnsureCapacity(PinnedBuffer* buffer, size_t bytes) {
  if (buffer->bytes() >= bytes) return absl::OkStatus();
  *buffer = PinnedBuffer();
  auto grown = PinnedBuffer::Create(bytes);
  if (!grown.ok()) return grown.status();
  *buffer = std::move(*grown);
  return absl::OkStatus();
}

}  // namespace lamina::cuda
