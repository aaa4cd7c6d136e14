#include "common/cuda/ipc.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"

namespace lamina::cuda {

absl::StatusOr<std::string> ExportIpcHandle(void* base) {
  cudaIpcMemHandle_t handle;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, base));
  return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
}

absl::StatusOr<IpcMapping> IpcMapping::Open(const std::string& handle) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CUDA IPC handle is ", sizeof(cudaIpcMemHandle_t), " bytes, got ", handle.size()));
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map the peer's GPU memory through CUDA IPC: ", cudaGetErrorString(e)));
  }
  IpcMapping m;
  m.data_.reset(p);
  return m;
}

absl::StatusOr<std::string> PciBusId(int device) {
  char id[32] = {};
  LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(id, sizeof(id), device));
  return std::string(id);
}

bool SameGpuOrNvlink(int device, const std::string& peer) {
  int peer_device = -1;
  if (cudaDeviceGetByPCIBusId(&peer_device, peer.c_str()) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (peer_device == device) return true;
  int atomics = 0;
  if (cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, device, peer_device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return atomics == 1;
}

}  // namespace lamina::cuda
