// Owners of CUDA resources: device memory, pinned host memory, streams and events. Each comes from
// a factory that returns a Status and frees its resource when destroyed; all are move-only.
// Thread-compatible.
#ifndef LAMINA_COMMON_CUDA_DEVICE_BUFFER_H_
#define LAMINA_COMMON_CUDA_DEVICE_BUFFER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace lamina::cuda {

// Device memory of a fixed size on the current device.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // ResourceExhausted naming the size when the device is full. A zero size gives an empty buffer.
  static absl::StatusOr<DeviceBuffer> Create(size_t bytes);
  // The same, its bytes zeroed (cudaMemset: ordered before later work on the legacy default stream).
  static absl::StatusOr<DeviceBuffer> CreateZeroed(size_t bytes);
  // Stream-ordered (cudaMallocAsync, cudaFreeAsync): allocated and freed in `stream`'s order,
  // which must outlive the buffer, without waiting for the device. cudaFree waits for every
  // kernel of the process, among them waits queued ahead on a peer's flag (the data planes),
  // which may depend on what this thread was about to do: a buffer that grows while such waits
  // may spin must be of this kind. Not for CUDA IPC.
  static absl::StatusOr<DeviceBuffer> CreateOnStream(size_t bytes, cudaStream_t stream);

  template <typename T>
  T* as() const { return static_cast<T*>(data_.get()); }
  void* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }

 private:
  struct Free {
    Free() : ordered(false), stream(nullptr) {}
    explicit Free(cudaStream_t s) : ordered(true), stream(s) {}
    bool ordered;
    cudaStream_t stream;
    void operator()(void* p) const {
      if (ordered) {
        cudaFreeAsync(p, stream);
      } else {
        cudaFree(p);
      }
    }
  };
  std::unique_ptr<void, Free> data_;
  size_t bytes_ = 0;
};

// Page-locked host memory, so that copies to and from the device run asynchronously at full rate.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static absl::StatusOr<PinnedBuffer> Create(size_t bytes);

  template <typename T>
  T* as() const { return static_cast<T*>(data_.get()); }
  void* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(void* p) const { cudaFreeHost(p); }
  };
  std::unique_ptr<void, Free> data_;
  size_t bytes_ = 0;
};

// A non-blocking stream.
class Stream {
 public:
  static absl::StatusOr<Stream> Create();
  cudaStream_t get() const { return stream_.get(); }
  absl::Status Synchronize() const;

 private:
  struct Destroy {
    void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
  };
  std::unique_ptr<CUstream_st, Destroy> stream_;
};

// An event for timing (with timing enabled) or ordering.
class Event {
 public:
  static absl::StatusOr<Event> Create();
  // Without timing: cheaper to record and wait on, for ordering one stream after another.
  static absl::StatusOr<Event> CreateForOrdering();
  cudaEvent_t get() const { return event_.get(); }
  absl::Status Record(cudaStream_t stream) const;
  // Holds `stream` until the work recorded before this event is done.
  absl::Status HoldUntilDone(cudaStream_t stream) const;
  // Milliseconds from `start` to this event; both must have completed.
  absl::StatusOr<float> ElapsedSince(const Event& start) const;

 private:
  static absl::StatusOr<Event> CreateWithFlags(unsigned flags);
  struct Destroy {
    void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
  };
  std::unique_ptr<CUevent_st, Destroy> event_;
};

// Grows `buffer` to at least `bytes` (never shrinks); the contents are not kept.
absl::Status EnsureCapacity(DeviceBuffer* buffer, size_t bytes);
absl::Status EnsureCapacity(PinnedBuffer* buffer, size_t bytes);
// The same without waiting for the device (see CreateOnStream): the device buffer is reallocated
// in `stream`'s order; an outgrown pinned buffer (cudaFreeHost may wait for the device too) is
// kept in `retired` rather than freed, and the new one is at least twice its size, so that
// retired buffers add at most the final size.
absl::Status EnsureCapacityOnStream(DeviceBuffer* buffer, size_t bytes, cudaStream_t stream);
absl::Status EnsureCapacityKeepingOld(PinnedBuffer* buffer, size_t bytes, std::vector<PinnedBuffer>* retired);

}  // namespace lamina::cuda

#endif  // LAMINA_COMMON_CUDA_DEVICE_BUFFER_H_
