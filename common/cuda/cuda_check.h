// Turning CUDA and cuBLAS error codes into absl::Status. Every CUDA call and kernel launch in
// Lamina goes through one of these macros, so a failure names the call and where it happened:
//   LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(...));
//   LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());  // after a launch
// Thread-safe.
#ifndef LAMINA_COMMON_CUDA_CUDA_CHECK_H_
#define LAMINA_COMMON_CUDA_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace lamina::cuda {

// OK for cudaSuccess; otherwise ResourceExhausted for out-of-memory, Unavailable for a missing or
// broken device, Internal for the rest, with `what` and `where` in the message.
absl::Status CudaStatus(cudaError_t error, const char* what, const char* where);

}  // namespace lamina::cuda

#define LAMINA_CUDA_STRINGIFY_(x) #x
#define LAMINA_CUDA_LINE_(x) LAMINA_CUDA_STRINGIFY_(x)

#define LAMINA_CUDA_RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                             \
    const cudaError_t lamina_cuda_error_ = (expr);                                                 \
    if (lamina_cuda_error_ != cudaSuccess) {                                                       \
      return ::lamina::cuda::CudaStatus(lamina_cuda_error_, #expr, __FILE__ ":" LAMINA_CUDA_LINE_(__LINE__)); \
    }                                                                                              \
  } while (0)

#endif  // LAMINA_COMMON_CUDA_CUDA_CHECK_H_
