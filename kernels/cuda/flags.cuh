// Device-side helpers for the data planes' flags (data_plane.h): 64-bit words that only grow, a
// sender raising one after its rows with release ordering at system scope, a receiver spinning on
// it. Include only from .cu files.
#ifndef LAMINA_KERNELS_CUDA_FLAGS_CUH_
#define LAMINA_KERNELS_CUDA_FLAGS_CUH_

#include <cstdint>

namespace lamina::kernels::cuda {

__device__ inline void StoreRelease(uint64_t* flag, uint64_t value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
}

__device__ inline uint64_t LoadRelaxed(const uint64_t* flag) {
  uint64_t value;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(flag) : "memory");
  return value;
}

__device__ inline uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread: returns once *flag >= value (== value with kExact), with acquire ordering (the
// spin itself uses relaxed loads, and one fence follows, so that many spinning blocks stay cheap).
// After `timeout_ns` it gives up and sets *error = code when still 0. Once *error is set it
// returns at once, and it looks at *error every kSpinsBetweenChecks spins too: another wait that
// gave up, or the host aborting the step (its peer is gone), ends the spin then, not after the
// timeout. `error` may be host memory, so it is written with a plain store.
constexpr int kSpinsBetweenChecks = 64;

template <bool kExact = false>
__device__ inline void SpinOnFlag(const uint64_t* flag, uint64_t value, int64_t timeout_ns, uint32_t* error,
                                  uint32_t code) {
  volatile uint32_t* e = error;
  if (*e != 0) return;  // the step failed already: do not wait again
  const uint64_t start = GlobalTimerNs();
  // The clock is read every spin, as before the error word was, which paces the flag's loads.
  for (int spins = 1; kExact ? LoadRelaxed(flag) != value : LoadRelaxed(flag) < value; ++spins) {
    if (static_cast<int64_t>(GlobalTimerNs() - start) > timeout_ns) {
      if (*e == 0) *e = code;
      __threadfence_system();
      return;
    }
    if (spins % kSpinsBetweenChecks == 0 && *e != 0) return;  // aborted, or another wait gave up
  }
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}

// Whether the error word is set (false for a null one).
__device__ inline bool ErrorSet(const uint32_t* error) {
  return error != nullptr && *const_cast<volatile const uint32_t*>(error) != 0;
}

// Called by every thread of a block once its writes are done: the last of `blocks` blocks to get
// here sets *flag = value (release, system scope), unless the error word is set. Only thread 0
// fences, after the barrier (fences are cumulative), as NVSHMEM's block-scoped put-with-signal
// does; a lone block needs no more than the release store itself. `arrivals` is a zeroed device
// word, left zeroed. True in thread 0 of the last block, false elsewhere. A null `flag`: only the
// count, relaxed, with no fence (nothing written before is ordered by it).
//
// `error_read`: ErrorSet(error) as thread 0 read it at the start of the launch, for launches in
// which no block sets the error word, so that the read is off the path; null reads it here.
__device__ inline bool ArriveAndRaise(uint32_t* arrivals, uint32_t blocks, uint64_t* flag, uint64_t value,
                                      const uint32_t* error, const bool* error_read = nullptr) {
  __syncthreads();
  if (threadIdx.x != 0) return false;
  if (blocks > 1) {
    uint32_t before;
    if (flag != nullptr) {
      __threadfence_system();
      asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(arrivals) : "memory");
    } else {
      asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(arrivals) : "memory");
    }
    if (before + 1 != blocks) return false;
    *arrivals = 0;
  }
  if (flag != nullptr && !(error_read != nullptr ? *error_read : ErrorSet(error))) StoreRelease(flag, value);
  return true;
}

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_FLAGS_CUH_
