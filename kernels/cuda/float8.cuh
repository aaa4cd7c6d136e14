// Device helpers of the float8 e4m3 KV cache (attention.h's Float8KvLayer): quantizing a head as
// the CPU's pool does (QuantizeFloat8E4M3, common/tensor/float8.h), to the same codes and scales,
// and widening codes to bf16 for the tensor cores, exactly (every e4m3 value is a bf16 one).
#ifndef LAMINA_KERNELS_CUDA_FLOAT8_CUH_
#define LAMINA_KERNELS_CUDA_FLOAT8_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/reduce.cuh"

namespace lamina::kernels::cuda {

// The largest finite e4m3 magnitude (kFloat8E4M3Max in common/tensor/float8.h).
constexpr float kFloat8Max = 448.0f;

// Quantizes one head of `head_dim` values, thread i holding value i (threads from head_dim on hold
// none): the head's scale is its largest magnitude ÷ 448, its codes the e4m3 values nearest
// x × (448 ÷ largest), rounded to nearest even and saturating, as on the CPU. A head of zeros (or
// of magnitudes below 2^-100) gets scale 0 and zero codes, one holding a NaN or an infinity scale
// NaN and zero codes. Every thread of the block calls it (it holds barriers); head_dim is at most
// blockDim.x.
__device__ inline void QuantizeHead(float x, int head_dim, uint8_t* codes, float* scale) {
  const bool mine = threadIdx.x < head_dim;
  const float magnitude = mine ? fabsf(x) : 0.f;
  const bool broken = __syncthreads_or(mine && !(magnitude <= FLT_MAX)) != 0;
  const float largest = BlockMax(magnitude);
  if (broken || largest < 0x1p-100f) {
    if (mine) codes[threadIdx.x] = 0;
    if (threadIdx.x == 0) *scale = broken ? __int_as_float(0x7fc00000) : 0.f;
    return;
  }
  const float inverse = kFloat8Max / largest;
  if (mine) codes[threadIdx.x] = __nv_cvt_float_to_fp8(x * inverse, __NV_SATFINITE, __NV_E4M3);
  if (threadIdx.x == 0) *scale = largest / kFloat8Max;
}

// Two e4m3 codes (the first in the low byte) as a bf16 pair (the first in the low half).
__device__ __forceinline__ uint32_t WidenCodePair(uint32_t two_codes) {
  const __half2_raw halves = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes), __NV_E4M3);
  const float2 values = __half22float2(__half2(halves));
  const __nv_bfloat162 widened = __floats2bfloat162_rn(values.x, values.y);
  return *reinterpret_cast<const uint32_t*>(&widened);
}

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_FLOAT8_CUH_
