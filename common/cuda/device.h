// Which device a node runs on: "cpu" or "cuda:N", as written in the topology.
// Thread-safe.
#ifndef LAMINA_COMMON_CUDA_DEVICE_H_
#define LAMINA_COMMON_CUDA_DEVICE_H_

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

// The names of the visible GPUs (e.g. "NVIDIA H200"), in ordinal order; empty without CUDA or GPUs.
std::vector<std::string> GpuNames();

}  // namespace lamina

#endif  // LAMINA_COMMON_CUDA_DEVICE_H_
