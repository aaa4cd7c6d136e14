#include "compute_node/sampling/logprobs.h"

#include <algorithm>
#include <cmath>

namespace lamina {
namespace {

// Whether (value a, id ia) ranks before (b, ib): larger first, the lower id among equals.
bool RanksBefore(float a, int32_t ia, float b, int32_t ib) { return a > b || (a == b && ia < ib); }

}  // namespace

TokenLogprobs ComputeLogprobs(const float* logits, int64_t vocab_size, int32_t token, int32_t top) {
  TokenLogprobs out;
  out.top_count = static_cast<int32_t>(std::min<int64_t>(std::clamp(top, 0, kMaxTopLogprobs), vocab_size));
  float max_logit = -INFINITY;
  for (int64_t i = 0; i < vocab_size; ++i) {
    const float v = logits[i];
    if (v > max_logit) max_logit = v;
    if (out.top_count == 0) continue;
    // Keep the best top_count seen so far, in rank order; ids come in increasing order, so an
    // equal value never displaces one already kept.
    const int32_t id = static_cast<int32_t>(i);
    int32_t kept = std::min<int32_t>(static_cast<int32_t>(i), out.top_count);
    if (kept == out.top_count && !RanksBefore(v, id, out.top_logprobs[kept - 1], out.top_ids[kept - 1])) continue;
    int32_t at = kept == out.top_count ? kept - 1 : kept;
    while (at > 0 && RanksBefore(v, id, out.top_logprobs[at - 1], out.top_ids[at - 1])) {
      out.top_logprobs[at] = out.top_logprobs[at - 1];
      out.top_ids[at] = out.top_ids[at - 1];
      --at;
    }
    out.top_logprobs[at] = v;
    out.top_ids[at] = id;
  }
  double sum = 0.0;
  if (max_logit > -INFINITY) {
    for (int64_t i = 0; i < vocab_size; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  }
  const double log_total = max_logit + std::log(sum);
  out.logprob = static_cast<float>(logits[token] - log_total);
  for (int32_t k = 0; k < out.top_count; ++k) {
    out.top_logprobs[k] = static_cast<float>(out.top_logprobs[k] - log_total);
  }
  return out;
}

}  // namespace lamina
