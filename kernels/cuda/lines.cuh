// Device-side helpers for lines (line.h): one store writes a line, and a receiver polls a line
// until both its tags match. Include only from .cu files.
#ifndef LAMINA_KERNELS_CUDA_LINES_CUH_
#define LAMINA_KERNELS_CUDA_LINES_CUH_

#include <cstdint>

#include "kernels/cuda/flags.cuh"
#include "kernels/cuda/line.h"

namespace lamina::kernels::cuda {

// Floats i and i + 1 of what `lines` mirrors from `mirror` on (i even).
__device__ inline const Line* LineOf(const Line* lines, const float* mirror, const float* at) {
  return lines + (at - mirror) / 2;
}

__device__ inline void StoreLine(Line* line, float first, float second, uint32_t tag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(__float_as_uint(first)),
               "r"(tag), "r"(__float_as_uint(second)), "r"(tag)
               : "memory");
}

// A receiver's clock for polling many lines: one thread's start time, its error word and whether
// the step had failed when it began. Polls give up together once the timeout has passed since
// `start`, or at once after any wait set the error word.
struct LinePoll {
  uint64_t start;
  int64_t timeout_ns;
  uint32_t* error;
  uint32_t code;
  bool failed;  // the error word was set when polling began: nothing will come

  // Reads the error word now (in flight with the first poll, not before it).
  __device__ static LinePoll Begin(int64_t timeout_ns, uint32_t* error, uint32_t code) {
    return {GlobalTimerNs(), timeout_ns, error, code, ErrorSet(error)};
  }
};

// The line's two floats once both its tags are `tag`. A poll that gives up sets *error = code
// (when still 0) and returns the line's floats as they are; so does every later poll by this
// thread, at once.
__device__ inline float2 PollLine(const Line* line, uint32_t tag, LinePoll& poll) {
  for (int spins = 0;; ++spins) {
    uint32_t first, first_tag, second, second_tag;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(first), "=r"(first_tag), "=r"(second), "=r"(second_tag)
                 : "l"(line)
                 : "memory");
    if ((first_tag == tag && second_tag == tag) || poll.failed) {
      return make_float2(__uint_as_float(first), __uint_as_float(second));
    }
    // Now and then: has the time run out, or did another wait give up?
    if ((spins & 63) == 63) {
      volatile uint32_t* e = poll.error;
      if (*e != 0) {
        poll.failed = true;
      } else if (static_cast<int64_t>(GlobalTimerNs() - poll.start) > poll.timeout_ns) {
        *e = poll.code;
        __threadfence_system();
        poll.failed = true;
      }
    }
  }
}

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_LINES_CUH_
