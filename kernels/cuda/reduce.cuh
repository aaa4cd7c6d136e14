// Warp and block reductions shared by the CUDA kernels. Block versions need blockDim.x to be a
// multiple of 32 (at most 1024) and every thread of the block to call them.
#ifndef LAMINA_KERNELS_CUDA_REDUCE_CUH_
#define LAMINA_KERNELS_CUDA_REDUCE_CUH_

namespace lamina::kernels::cuda {

// The factor that normalizes a softmax's weighted sum of values by the weights' `sum` (0 when
// nothing was weighted): one reciprocal a head, multiplied into each of its outputs. A division
// each output costs far more: CUDA's IEEE division leaves its fast path for a zero numerator (a
// value's dims that are zero), and its slow path costs microseconds a launch.
__device__ __forceinline__ float OutputScale(float sum) { return sum > 0.f ? 1.f / sum : 0.f; }

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum over the block, returned to every thread.
template <typename T>
__device__ __forceinline__ T BlockSum(T v) {
  __shared__ T partial[32];
  __syncthreads();  // the array may still be read by a previous call
  v = WarpSum(v);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? partial[lane] : T{};
  return WarpSum(v);
}

__device__ __forceinline__ float BlockMax(float v) {
  __shared__ float partial[32];
  __syncthreads();
  v = WarpMax(v);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? partial[lane] : -INFINITY;
  return WarpMax(v);
}

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_REDUCE_CUH_
