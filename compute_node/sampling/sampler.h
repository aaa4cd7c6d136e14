// Per-request token sampling: greedy at temperature 0; otherwise softmax at the temperature,
// restricted to the top_k most likely tokens and to the smallest set whose probability reaches
// top_p, then a draw from the request's own random stream (seeded, so a seed reproduces a run).
// Thread-compatible: one Sampler per sequence.
#ifndef LAMINA_COMPUTE_NODE_SAMPLING_SAMPLER_H_
#define LAMINA_COMPUTE_NODE_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"

namespace lamina {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: no limit
  float top_p = 1.0f;        // 1: no limit
  uint64_t seed = 0;         // the random stream's seed

  // InvalidArgument naming the field when a value is out of range.
  absl::Status Validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

  int32_t Sample(const float* logits, int64_t vocab_size);  // logits: [vocab_size]

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // scratch
};

// The index of the largest logit; the lowest index on ties.
int32_t ArgMax(const float* logits, int64_t vocab_size);

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_SAMPLING_SAMPLER_H_
