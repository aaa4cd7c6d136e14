// Destroying objects that own device memory only while no device step runs.
//
// Freeing device or pinned memory (cudaFree, cudaFreeHost, closing a CUDA IPC mapping) synchronizes
// the device: it waits for every kernel queued before it, and kernels queued after it do not start
// until it is done. Our device steps queue kernels that spin on flags another process raises (device
// links, hand-overs), and that process may in turn wait for kernels held back here. A free while
// such a step runs then stalls both until a spin times out (seconds, when memory nodes free a
// killed compute node's links beside a survivor's steps).
//
// So a process brackets each device step with BeginStep and EndStep (ScopedDeviceStep), and hands
// objects owning device memory to Retire rather than destroying them: they are destroyed at once
// when no step runs, else by the last running step's EndStep. A step beginning while they are
// destroyed waits for that. Thread-safe.
#ifndef LAMINA_COMMON_THREADING_QUIESCENT_RELEASE_H_
#define LAMINA_COMMON_THREADING_QUIESCENT_RELEASE_H_

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace lamina {

class QuiescentRelease {
 public:
  QuiescentRelease() = default;
  QuiescentRelease(const QuiescentRelease&) = delete;
  QuiescentRelease& operator=(const QuiescentRelease&) = delete;

  // The process's: its device steps share its GPUs.
  static QuiescentRelease& Process();

  // A device step begins queueing work (waits while retired objects are being destroyed).
  void BeginStep();
  // Every kernel the step queued has ended.
  void EndStep();
  // Destroys `object` now if no step runs, else once none does. Null is ignored.
  template <typename T>
  void Retire(std::unique_ptr<T> object) {
    if (object != nullptr) RetireShared(std::shared_ptr<void>(std::move(object)));
  }

  int running_steps() const;
  size_t retired_objects() const;  // waiting to be destroyed

 private:
  void RetireShared(std::shared_ptr<void> object);
  // Destroys what waits while no step runs (mu_ held by `lock`, released meanwhile).
  void ReleaseWhileQuiet(std::unique_lock<std::mutex>& lock);

  mutable std::mutex mu_;
  std::condition_variable released_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool releasing_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<void>> waiting_ ABSL_GUARDED_BY(mu_);
};

// BeginStep on construction, EndStep on destruction.
class ScopedDeviceStep {
 public:
  explicit ScopedDeviceStep(QuiescentRelease* release = &QuiescentRelease::Process()) : release_(release) {
    release_->BeginStep();
  }
  ~ScopedDeviceStep() { release_->EndStep(); }
  ScopedDeviceStep(const ScopedDeviceStep&) = delete;
  ScopedDeviceStep& operator=(const ScopedDeviceStep&) = delete;

 private:
  QuiescentRelease* release_;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_THREADING_QUIESCENT_RELEASE_H_
