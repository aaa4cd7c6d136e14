#include "compute_node/sampling/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace lamina {

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be >= 0, got ", temperature));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  return absl::OkStatus();
}

int32_t ArgMax(const float* logits, int64_t vocab_size) {
  int32_t best = 0;
  for (int64_t i = 1; i < vocab_size; ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

int32_t Sampler::Sample(const float* logits, int64_t vocab_size) {
  if (params_.temperature == 0.0f) return ArgMax(logits, vocab_size);

  candidates_.clear();
  for (int64_t i = 0; i < vocab_size; ++i) candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
  auto by_logit = [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = params_.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(keep);

  // Softmax at the temperature, in double, over the kept candidates (sorted, most likely first).
  std::vector<double> probs(keep);
  const double max_logit = candidates_[0].first;
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((candidates_[i].first - max_logit) / params_.temperature);
    total += probs[i];
  }
  size_t nucleus = keep;
  if (params_.top_p < 1.0f) {
    double cumulative = 0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs[i] / total;
      if (cumulative >= params_.top_p) {
        nucleus = i + 1;
        break;
      }
    }
  }
  double nucleus_total = 0;
  for (size_t i = 0; i < nucleus; ++i) nucleus_total += probs[i];
  // 53 random bits give a uniform double in [0, 1), the same on every platform.
  const double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0) * nucleus_total;
  double cumulative = 0;
  for (size_t i = 0; i < nucleus; ++i) {
    cumulative += probs[i];
    if (u < cumulative) return candidates_[i].second;
  }
  return candidates_[nucleus - 1].second;
}

}  // namespace lamina
