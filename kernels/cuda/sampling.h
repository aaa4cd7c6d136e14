// Token sampling on the GPU, one block per row of logits (a cluster of up to 8 blocks per row while
// the rows leave SMs idle, the others reading slices of the row for the first), with the semantics of
// compute_node/sampling/sampler.h: greedy at temperature 0 (lowest index on ties); otherwise the
// softmax at the temperature restricted to the logits within min_p's offset of the largest and to
// the top_k largest logits, then to the smallest set of those whose probability reaches top_p of
// theirs, and one draw from it.
//
// The thresholds are found by radix selection over the logits' bits (no sort), and probability
// masses are summed in 32.32 fixed point, so a draw is bit-for-bit reproducible. The selection
// runs on the logits of the narrowest band below the row's maximum that holds everything it can
// keep (up to 16,384 of them, gathered in id order into shared memory), else over the whole row
// (top-p alone over a flat row: the slow case, tests/bench/RESULTS.md). The random number
// is a counter-based hash of (seed, counter): pass the token's position as the counter and a
// sequence resumes its stream anywhere. The CPU sampler (SampleToken) draws with the same masses
// and numbers, so both draw the same token from the same logits; it is this kernel's oracle.
// Thread-safe; queues work on `stream`, chained (chaining.h).
#ifndef LAMINA_KERNELS_CUDA_SAMPLING_H_
#define LAMINA_KERNELS_CUDA_SAMPLING_H_

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"

namespace lamina::kernels::cuda {

struct DeviceSamplingParams {
  float temperature;  // 0: greedy
  int32_t top_k;      // 0: no limit
  float top_p;        // 1: no limit
  uint64_t seed;
  uint64_t counter;   // e.g. the position of the token being sampled
  // Logits below the largest plus this are dropped (min_p: temperature * ln(min_p), as
  // MinPLogitOffset in compute_node/sampling/sampler.h); -infinity: no limit.
  float min_p_offset = -INFINITY;
};

// Draws one token per draw: draw i from logits row `rows[i]` (row i when `rows` is null).
absl::Status Sample(const float* logits,                 // [logits rows, vocab]
                    const int32_t* rows,                 // [draws] or null, device memory
                    const DeviceSamplingParams* params,  // [draws], device memory
                    int32_t* tokens,                     // [draws]
                    int64_t draws, int64_t vocab, cudaStream_t stream);

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_SAMPLING_H_
