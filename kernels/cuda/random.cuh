// Counter-based random numbers for the CUDA kernels: a pure function of its input, so a value
// depends only on (seed, counter) and not on which thread or launch computes it.
#ifndef LAMINA_KERNELS_CUDA_RANDOM_CUH_
#define LAMINA_KERNELS_CUDA_RANDOM_CUH_

#include <cstdint>

namespace lamina::kernels::cuda {

// SplitMix64's output function: a bijective mix of all 64 bits.
__device__ __forceinline__ uint64_t SplitMix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_RANDOM_CUH_
