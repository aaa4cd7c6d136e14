// Device side of the hop clocks (data_plane.h, "Hop clocks"), for the data plane's send and
// receive kernels. Include only from .cu files.
#ifndef LAMINA_KERNELS_CUDA_HOP_CLOCK_CUH_
#define LAMINA_KERNELS_CUDA_HOP_CLOCK_CUH_

#include <cstdint>

#include "kernels/cuda/flags.cuh"

namespace lamina::kernels::cuda {

// One thread of a block of a send, once it may read its rows: lowers *sent_at to now (null:
// nothing).
__device__ inline void StampSent(uint64_t* sent_at) {
  if (sent_at != nullptr) atomicMin(reinterpret_cast<unsigned long long*>(sent_at), GlobalTimerNs());
}

// Every thread of a block of a receive, once its rows are in place (the launch's blocks all call
// it, or none): raises *back_at to now (null: nothing).
__device__ inline void StampBack(uint64_t* back_at) {
  if (back_at == nullptr) return;
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned long long*>(back_at), GlobalTimerNs());
}

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_HOP_CLOCK_CUH_
