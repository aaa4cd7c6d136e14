#include "kernels/cuda/data_plane.h"

#include "common/cuda/cuda_check.h"

namespace lamina::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kRowsPerBlock = 4;

__device__ inline void StoreRelease(uint64_t* flag, uint64_t value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
}

__device__ inline uint64_t LoadAcquire(const uint64_t* flag) {
  uint64_t value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(flag) : "memory");
  return value;
}

__device__ inline uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Rows are copied as float4 when every row start is 16-byte aligned, else as floats.
__global__ void SendRowsKernel(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                               float* dst, int64_t dst_stride, uint64_t* flag, uint64_t value, const uint32_t* error,
                               uint32_t* arrivals, bool vectorized) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  for (int64_t r = first; r < first + kRowsPerBlock && r < count; ++r) {
    const float* from = src + (rows ? static_cast<int64_t>(rows[r]) : r) * src_stride;
    float* to = dst + r * dst_stride;
    if (vectorized) {
      const float4* from4 = reinterpret_cast<const float4*>(from);
      float4* to4 = reinterpret_cast<float4*>(to);
      for (int64_t i = threadIdx.x; i < cols / 4; i += blockDim.x) to4[i] = from4[i];
    } else {
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) to[i] = from[i];
    }
  }
  // The last block to finish raises the flag, after every block's rows are visible system-wide.
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t arrived = atomicAdd(arrivals, 1u) + 1;
    if (arrived == gridDim.x) {
      *arrivals = 0;
      __threadfence_system();
      if (error == nullptr || *const_cast<volatile const uint32_t*>(error) == 0) StoreRelease(flag, value);
    }
  }
}

__global__ void WaitFlagKernel(const uint64_t* flag, uint64_t value, int64_t timeout_ns, uint32_t* error,
                               uint32_t code) {
  volatile uint32_t* e = error;
  if (*e != 0) return;  // the step failed already: do not wait again
  const uint64_t start = GlobalTimerNs();
  while (LoadAcquire(flag) < value) {
    if (static_cast<int64_t>(GlobalTimerNs() - start) > timeout_ns) {
      // A plain store: the word may be host memory, where device atomics are not guaranteed.
      if (*e == 0) *e = code;
      __threadfence_system();
      return;
    }
  }
}

__global__ void ScatterRowsKernel(const float* src, int64_t src_stride, const int32_t* rows, int64_t count,
                                  int64_t cols, float* dst, int64_t dst_stride) {
  const int64_t r = blockIdx.x;
  const float* from = src + r * src_stride;
  float* to = dst + static_cast<int64_t>(rows[r]) * dst_stride;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) to[i] = from[i];
}

__global__ void GatherRowsKernel(const float* src, int64_t src_stride, const int32_t* rows, int64_t cols, float* dst,
                                 int64_t dst_stride) {
  const int64_t r = blockIdx.x;
  const float* from = src + static_cast<int64_t>(rows[r]) * src_stride;
  float* to = dst + r * dst_stride;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) to[i] = from[i];
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

absl::Status SendRows(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                      float* dst, int64_t dst_stride, uint64_t* flag, uint64_t value, const uint32_t* error,
                      uint32_t* arrivals, cudaStream_t stream) {
  if (count < 0 || cols < 0) return absl::InvalidArgumentError("SendRows: negative count or cols");
  const bool vectorized = Aligned16(src) && Aligned16(dst) && cols % 4 == 0 && src_stride % 4 == 0 &&
                          dst_stride % 4 == 0;
  // At least one block, so that an empty send still raises its flag.
  const int64_t blocks = count == 0 ? 1 : (count + kRowsPerBlock - 1) / kRowsPerBlock;
  SendRowsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(src, src_stride, rows, count, cols, dst,
                                                                          dst_stride, flag, value, error, arrivals,
                                                                          vectorized);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status WaitFlag(const uint64_t* flag, uint64_t value, int64_t timeout_ns, uint32_t* error, uint32_t code,
                      cudaStream_t stream) {
  WaitFlagKernel<<<1, 1, 0, stream>>>(flag, value, timeout_ns, error, code);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status PreloadDataPlaneKernels() {
  cudaFuncAttributes attributes;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, SendRowsKernel));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, WaitFlagKernel));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, ScatterRowsKernel));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, GatherRowsKernel));
  return absl::OkStatus();
}

absl::Status ScatterRows(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                         float* dst, int64_t dst_stride, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  ScatterRowsKernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(src, src_stride, rows, count, cols, dst,
                                                                            dst_stride);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status GatherRows(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                        float* dst, int64_t dst_stride, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  GatherRowsKernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(src, src_stride, rows, cols, dst,
                                                                           dst_stride);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace lamina::kernels::cuda
