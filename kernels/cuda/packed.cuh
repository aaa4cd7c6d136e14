// Values packed in 16-byte loads and stores, shared by the CUDA kernels.
#ifndef LAMINA_KERNELS_CUDA_PACKED_CUH_
#define LAMINA_KERNELS_CUDA_PACKED_CUH_

#include <cuda_bf16.h>

namespace lamina::kernels::cuda {

// The 8 bf16 of one 16-byte load, as floats: f[0..7].
__device__ __forceinline__ void Unpack8(const uint4& raw, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// 8 floats as the 8 bf16 of one 16-byte load, each rounded to nearest (as a bf16 store rounds).
__device__ __forceinline__ uint4 Pack8(const float* f) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return raw;
}

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_PACKED_CUH_
