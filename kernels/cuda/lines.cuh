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

// One poll of a line: its four words as they are now.
__device__ inline uint4 LoadLine(const Line* line) {
  uint4 raw;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
               : "l"(line)
               : "memory");
  return raw;
}

// Now and then while polling: has the time run out, did another wait give up, or did the host abort
// the step?
__device__ inline void CheckPoll(LinePoll& poll) {
  volatile uint32_t* e = poll.error;
  if (*e != 0) {
    poll.failed = true;
  } else if (static_cast<int64_t>(GlobalTimerNs() - poll.start) > poll.timeout_ns) {
    *e = poll.code;
    __threadfence_system();
    poll.failed = true;
  }
}

// The two floats of each of lines[0 .. n) (n <= kMost), once both its tags are `tag`. The lines
// are polled together, their loads in flight at once: a thread waits about one memory round trip
// for all of them once they are there, not one for each. A poll that gives up sets *error = code
// (when still 0) and takes the lines' floats as they are; so does every later poll by this
// thread, at once.
template <int kMost>
__device__ inline void PollLines(const Line* const (&lines)[kMost], int n, uint32_t tag, LinePoll& poll,
                                 float2 (&values)[kMost]) {
  static_assert(kMost >= 1 && kMost <= 32, "a word of pending lines");
  uint32_t pending = 0;
#pragma unroll
  for (int i = 0; i < kMost; ++i) {
    if (i < n) pending |= 1u << i;
  }
  for (int spins = 0; pending != 0; ++spins) {
    uint4 raw[kMost];
#pragma unroll
    for (int i = 0; i < kMost; ++i) {
      if (pending & (1u << i)) raw[i] = LoadLine(lines[i]);
    }
#pragma unroll
    for (int i = 0; i < kMost; ++i) {
      if ((pending & (1u << i)) && ((raw[i].y == tag && raw[i].w == tag) || poll.failed)) {
        values[i] = make_float2(__uint_as_float(raw[i].x), __uint_as_float(raw[i].z));
        pending &= ~(1u << i);
      }
    }
    if (pending != 0 && (spins + 1) % kSpinsBetweenChecks == 0) CheckPoll(poll);
  }
}

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_LINES_CUH_
