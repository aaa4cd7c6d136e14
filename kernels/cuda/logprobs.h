// Log probabilities of drawn tokens on the GPU, one block per draw, with the semantics of
// compute_node/sampling/logprobs.h (its oracle): log_softmax of the raw logits, the sum behind it
// accumulated in double; the most likely tokens most likely first, the lowest id first among
// equal logits. Only draws that ask are computed, so a batch where none asks costs nothing.
// Thread-safe; queues work on `stream`, chained (chaining.h).
#ifndef LAMINA_KERNELS_CUDA_LOGPROBS_H_
#define LAMINA_KERNELS_CUDA_LOGPROBS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace lamina::kernels::cuda {

inline constexpr int32_t kMaxDeviceTopLogprobs = 20;

struct DeviceTokenLogprobs {
  float logprob;      // of the drawn token
  int32_t top_count;  // entries in use below
  int32_t top_ids[kMaxDeviceTopLogprobs];
  float top_logprobs[kMaxDeviceTopLogprobs];
};

// For draw i with tops[i] >= 0: the log probability of tokens[i] in logits row `rows[i]` (row i
// when `rows` is null), and of the min(tops[i], vocab) most likely tokens, into out[i]. Draws
// with tops[i] < 0 are skipped (out[i] is left as it was). tops[i] <= kMaxDeviceTopLogprobs;
// tokens[i] and rows[i] must be in range.
absl::Status Logprobs(const float* logits,       // [logits rows, vocab]
                      const int32_t* rows,       // [draws] or null, device memory
                      const int32_t* tokens,     // [draws], device memory
                      const int32_t* tops,       // [draws], device memory
                      DeviceTokenLogprobs* out,  // [draws], device memory
                      int64_t draws, int64_t vocab, cudaStream_t stream);

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_LOGPROBS_H_
