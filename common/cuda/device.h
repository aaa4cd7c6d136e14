// Which device a node runs on: "cpu" or "cuda:N", as written in the topology.
// Thread-safe.
#ifndef LAMINA_COMMON_CUDA_DEVICE_H_
#define LAMINA_COMMON_CUDA_DEVICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lamina {

struct DeviceSpec {
  bool is_cuda = false;
  int index = 0;  // the CUDA device ordinal when is_cuda
};

// Parses "cpu" or "cuda:N". InvalidArgument naming the text otherwise.
absl::StatusOr<DeviceSpec> ParseDevice(const std::string& text);

// OK when `spec` can be used here: the CPU always; a CUDA device when this build has CUDA and the
// device exists. FailedPrecondition saying why not (no CUDA in this build, no GPU visible, index
// beyond the devices present). Makes a CUDA device current for the calling thread.
absl::Status UseDevice(const DeviceSpec& spec);

// Empty when at least one CUDA device is usable; otherwise why not, for tests that skip.
std::string NoGpuReason();

// A GPU's memory as the driver reports it, from this process's view.
struct GpuMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
// Asks without keeping the GPU: the CUDA context made to ask is released again (the caller must
// hold no other CUDA state on it). FailedPrecondition as UseDevice's for a device that cannot be
// used; InvalidArgument for the CPU.
absl::StatusOr<GpuMemory> QueryGpuMemory(const DeviceSpec& spec);

// The names of the visible GPUs (e.g. "NVIDIA H200"), in ordinal order; empty without CUDA or GPUs.
std::vector<std::string> GpuNames();

}  // namespace lamina

#endif  // LAMINA_COMMON_CUDA_DEVICE_H_
