// Repetition, presence and frequency penalties on the GPU: edits of single logits, in place, with
// the float operations of compute_node/sampling/penalties.h (its oracle), so a penalized row is
// the same bit for bit. The old values are kept, so that log probabilities, which are of the raw
// logits, can be taken after the draw.
// Thread-safe; queues work on `stream`, chained (chaining.h).
#ifndef LAMINA_KERNELS_CUDA_PENALTIES_H_
#define LAMINA_KERNELS_CUDA_PENALTIES_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace lamina::kernels::cuda {

// logits[row, token] = (x > 0 ? x / divisor : x * divisor) - subtract, for its old value x.
struct DevicePenaltyEdit {
  int32_t row;
  int32_t token;  // in [0, vocab)
  float divisor;
  float subtract;
};

// Applies edits[0 .. count) to logits [rows, vocab], each (row, token) at most once, and keeps
// each old value in saved[i].
absl::Status ApplyPenalties(float* logits, const DevicePenaltyEdit* edits, float* saved, int64_t count, int64_t vocab,
                            cudaStream_t stream);

// Puts back the values that ApplyPenalties saved for the same edits.
absl::Status RestoreLogits(float* logits, const DevicePenaltyEdit* edits, const float* saved, int64_t count,
                           int64_t vocab, cudaStream_t stream);

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_PENALTIES_H_
