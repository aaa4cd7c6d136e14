#include "common/cuda/device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "common/status/status_macros.h"

#ifdef LAMINA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lamina {

absl::StatusOr<DeviceSpec> ParseDevice(const std::string& text) {
  if (text == "cpu") return DeviceSpec{};
  int index = 0;
  if (absl::StartsWith(text, "cuda:") && absl::SimpleAtoi(text.substr(5), &index) && index >= 0) {
    return DeviceSpec{true, index};
  }
  return absl::InvalidArgumentError(absl::StrCat("device '", text, "' is neither 'cpu' nor 'cuda:N'"));
}

absl::Status UseDevice(const DeviceSpec& spec) {
  if (!spec.is_cuda) return absl::OkStatus();
#ifdef LAMINA_HAVE_CUDA
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("device cuda:", spec.index, ": no usable GPU (",
                                                      cudaGetErrorString(error), ")"));
  }
  if (spec.index >= count) {
    return absl::FailedPreconditionError(absl::StrCat("device cuda:", spec.index, ": only ", count,
                                                      " GPU(s) visible"));
  }
  const cudaError_t set = cudaSetDevice(spec.index);
  if (set != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("device cuda:", spec.index, ": ", cudaGetErrorString(set)));
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(absl::StrCat("device cuda:", spec.index,
                                                    ": this build of Lamina has no CUDA support"));
#endif
}

std::string NoGpuReason() {
#ifdef LAMINA_HAVE_CUDA
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) return absl::StrCat("no usable GPU: ", cudaGetErrorString(error));
  if (count == 0) return "no GPU visible";
  return "";
#else
  return "this build has no CUDA support";
#endif
}

absl::StatusOr<GpuMemory> QueryGpuMemory(const DeviceSpec& spec) {
  if (!spec.is_cuda) return absl::InvalidArgumentError("the CPU has no GPU memory to query");
  LAMINA_RETURN_IF_ERROR(UseDevice(spec));
  GpuMemory memory;
#ifdef LAMINA_HAVE_CUDA
  size_t free_bytes = 0, total_bytes = 0;
  const cudaError_t asked = cudaMemGetInfo(&free_bytes, &total_bytes);
  (void)cudaDeviceReset();  // the context made to ask holds memory of its own
  if (asked != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cuda:", spec.index, ": cannot read its memory: ", cudaGetErrorString(asked)));
  }
  memory.free_bytes = static_cast<int64_t>(free_bytes);
  memory.total_bytes = static_cast<int64_t>(total_bytes);
#endif
  return memory;
}

std::vector<std::string> GpuNames() {
  std::vector<std::string> names;
#ifdef LAMINA_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return names;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp props;
    if (cudaGetDeviceProperties(&props, i) == cudaSuccess) names.push_back(props.name);
  }
#endif
  return names;
}

}  // namespace lamina
