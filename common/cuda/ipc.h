// CUDA IPC: device memory of one process mapped into another's address space (GPUs of one host).
// The owner exports a handle for a whole cudaMalloc allocation; a peer process opens it once and
// reads and writes it from its own kernels (over NVLink or PCIe peer access) until closed.
// Opening a handle of the same process fails: IPC is for separate processes.
// Thread-compatible.
#ifndef LAMINA_COMMON_CUDA_IPC_H_
#define LAMINA_COMMON_CUDA_IPC_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace lamina::cuda {

// The handle of the allocation that starts at `base` (a cudaMalloc result), as bytes to send.
absl::StatusOr<std::string> ExportIpcHandle(void* base);

// The PCI bus id of GPU `device` ("0000:19:00.0"): how another process names the same GPU, whatever
// its device ordinals.
absl::StatusOr<std::string> PciBusId(int device);

// Whether GPU `device` and the GPU of PCI bus id `peer` are one GPU, or two joined by NVLink, from
// CUDA's peer attributes: native atomics between two GPUs go over NVLink only, never PCIe. False
// when the peer is not visible here (CUDA_VISIBLE_DEVICES) or cannot be asked about.
bool SameGpuOrNvlink(int device, const std::string& peer);

// A peer's allocation, mapped on the current device; unmapped when destroyed.
class IpcMapping {
 public:
  IpcMapping() = default;
  // FailedPrecondition naming CUDA's reason when the handle cannot be opened (another host,
  // the same process, no peer access).
  static absl::StatusOr<IpcMapping> Open(const std::string& handle);

  template <typename T>
  T* as() const { return static_cast<T*>(data_.get()); }

 private:
  struct Close {
    void operator()(void* p) const { cudaIpcCloseMemHandle(p); }
  };
  std::unique_ptr<void, Close> data_;
};

}  // namespace lamina::cuda

#endif  // LAMINA_COMMON_CUDA_IPC_H_
