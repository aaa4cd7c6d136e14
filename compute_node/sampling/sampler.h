// Token sampling, the CPU reference for the GPU kernel in kernels/cuda/sampling.h. A draw's
// penalties (penalties.h) change its logits first; then it is greedy at temperature 0 (the
// largest logit, lowest id on ties); otherwise the softmax at the temperature, restricted to the
// tokens whose probability is at least min_p times the largest one's, and to the top_k largest
// logits (every logit tied with the k-th is kept), then to the fewest largest logits of those whose
// probability reaches top_p of theirs, and one draw from what is kept.
//
// A draw is a pure function of (logits, params, counter): probability masses are 32.32 fixed-point
// integers, so their sums are exact in any order, and the random number is SplitMix64 of
// (seed, counter). Pass the position of the token being drawn as the counter: a sequence that is
// preempted and recomputed, or that moves to another batch, draws the same tokens, and the GPU
// kernel draws the same token from the same logits.
// Thread-safe (no state).
#ifndef LAMINA_COMPUTE_NODE_SAMPLING_SAMPLER_H_
#define LAMINA_COMPUTE_NODE_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace lamina {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: no limit
  float top_p = 1.0f;        // 1: no limit
  uint64_t seed = 0;         // the random stream's seed
  // Log probabilities to return with each token (compute_node/sampling/logprobs.h): the drawn
  // token's, and those of the `top_logprobs` most likely tokens (0 to kMaxTopLogprobs; more than 0
  // implies `logprobs`). They do not change which token is drawn.
  bool logprobs = false;
  int32_t top_logprobs = 0;

  // Penalties on the tokens the sequence has seen (penalties.h), applied to its logits before
  // anything else, greedy decoding included: a token in the prompt or generated has its logit
  // divided by `repetition_penalty` when positive and multiplied by it otherwise (1: off, above 1
  // discourages repeats); a generated token's logit then drops by `frequency_penalty` for each
  // time it was generated and by `presence_penalty` once (-2 to 2; 0: off).
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Keep only tokens whose probability is at least min_p times the most likely one's (0: no limit).
  float min_p = 0.0f;
  // Until the sequence has generated `min_tokens` tokens, the tokens of `min_tokens_stop_ids`
  // cannot be drawn: a penalty edit (penalties.h) makes their logits -infinity.
  int32_t min_tokens = 0;
  std::vector<int32_t> min_tokens_stop_ids = {};

  bool wants_logprobs() const { return logprobs || top_logprobs > 0; }
  bool holds_back_stops() const { return min_tokens > 0 && !min_tokens_stop_ids.empty(); }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f ||
           holds_back_stops();
  }

  // InvalidArgument naming the field when a value is out of range.
  absl::Status Validate() const;
};

class TokenHistory;

// One token to draw after a batch: from logits row `row`, with `params`, using random number
// `counter` of the seed's stream (the position of the token being drawn). `history`: the
// sequence's tokens, which its penalties count; needed when params.has_penalties(), and must
// outlive the draw. Draws of one row (the samples of one prompt) have the same penalties.
struct TokenDraw {
  int64_t row;
  SamplingParams params;
  uint64_t counter;
  const TokenHistory* history = nullptr;
};

// The logit offset from the largest below which min_p drops a token: temperature * ln(min_p), in
// float as the GPU kernel gets it; -infinity when min_p is off (0).
float MinPLogitOffset(const SamplingParams& params);

// One token from logits [vocab_size].
int32_t SampleToken(const float* logits, int64_t vocab_size, const SamplingParams& params, uint64_t counter);

// The index of the largest logit; the lowest index on ties (0 when no logit compares larger than
// -infinity).
int32_t ArgMax(const float* logits, int64_t vocab_size);

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_SAMPLING_SAMPLER_H_
