// Log probabilities of drawn tokens, the CPU reference for the GPU kernel in
// kernels/cuda/logprobs.h. They are of the model's own distribution, log_softmax of the raw logits,
// whatever temperature, top_k and top_p the token was drawn with (as vLLM and OpenAI report them):
// a client scores text with them, and compares them across sampling settings.
//
// The sum behind the softmax is accumulated in double. The most likely tokens come most likely
// first; among equal logits, the lowest id first (greedy's choice first).
// Thread-safe (no state).
#ifndef LAMINA_COMPUTE_NODE_SAMPLING_LOGPROBS_H_
#define LAMINA_COMPUTE_NODE_SAMPLING_LOGPROBS_H_

#include <cstdint>

namespace lamina {

// The most alternatives a request may ask for (OpenAI's top_logprobs limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

// One drawn token's log probability, and those of the `top_count` most likely tokens.
struct TokenLogprobs {
  float logprob = 0.0f;
  int32_t top_count = 0;
  int32_t top_ids[kMaxTopLogprobs] = {};
  float top_logprobs[kMaxTopLogprobs] = {};
};

// From logits [vocab_size]: the log probability of `token` (which must be in the vocabulary) and
// of the min(top, vocab_size) most likely tokens (0 <= top <= kMaxTopLogprobs).
TokenLogprobs ComputeLogprobs(const float* logits, int64_t vocab_size, int32_t token, int32_t top);

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_SAMPLING_LOGPROBS_H_
