#include "common/cuda/cuda_check.h"

#include "absl/strings/str_cat.h"

namespace lamina::cuda {

absl::Status CudaStatus(cudaError_t error, const char* what, const char* where) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(where, ": ", what, ": ", cudaGetErrorName(error), " (",
                                           cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace lamina::cuda
