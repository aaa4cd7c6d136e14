#include "compute_node/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compute_node/sampling/logprobs.h"

namespace lamina {
namespace {

constexpr double kFixedOne = 4294967296.0;  // probability 1 in 32.32 fixed point

// An unsigned key with the order of the float (the GPU kernel's).
uint32_t OrderedKey(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits ^ ((bits >> 31) ? 0xffffffffu : 0x80000000u);
}

uint64_t SplitMix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// exp((logit - max) / T) in 32.32 fixed point, rounded down.
uint64_t Weight(float logit, float max_logit, float temperature) {
  return static_cast<uint64_t>(std::exp((static_cast<double>(logit) - max_logit) / temperature) * kFixedOne);
}

// The high 64 bits of a 128-bit product: a uniform draw in [0, total).
uint64_t MulHigh(uint64_t a, uint64_t b) { return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64); }

}  // namespace

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be >= 0, got ", temperature));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) {
    return absl::InvalidArgumentError(absl::StrCat("repetition_penalty must be > 0, got ", repetition_penalty));
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("presence_penalty must be from -2 to 2, got ", presence_penalty));
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("frequency_penalty must be from -2 to 2, got ", frequency_penalty));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must be from 0 to 1, got ", min_p));
  }
  if (min_tokens < 0) return absl::InvalidArgumentError(absl::StrCat("min_tokens must be >= 0, got ", min_tokens));
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs must be from 0 to ", kMaxTopLogprobs, ", got ", top_logprobs));
  }
  return absl::OkStatus();
}

float MinPLogitOffset(const SamplingParams& params) {
  if (params.min_p <= 0.0f) return -INFINITY;
  return static_cast<float>(static_cast<double>(params.temperature) * std::log(static_cast<double>(params.min_p)));
}

int32_t ArgMax(const float* logits, int64_t vocab_size) {
  float best = -INFINITY;
  int64_t best_index = -1;
  for (int64_t i = 0; i < vocab_size; ++i) {
    if (logits[i] > best) {
      best = logits[i];
      best_index = i;
    }
  }
  return best_index < 0 ? 0 : static_cast<int32_t>(best_index);
}

int32_t SampleToken(const float* logits, int64_t vocab_size, const SamplingParams& params, uint64_t counter) {
  const int32_t greedy = ArgMax(logits, vocab_size);
  if (params.temperature <= 0.0f || !(logits[greedy] > -INFINITY)) return greedy;
  const float max_logit = logits[greedy];

  // Every key >= threshold is kept: min_p's floor, then the k-th largest key if higher.
  uint32_t threshold = params.min_p > 0.0f ? OrderedKey(max_logit + MinPLogitOffset(params)) : 0;
  // The keys kept, largest first (ties in id order do not matter: a threshold keeps all of them).
  std::vector<std::pair<uint32_t, uint64_t>> kept;  // (key, weight)
  kept.reserve(vocab_size);
  for (int64_t i = 0; i < vocab_size; ++i) kept.emplace_back(OrderedKey(logits[i]), 0);
  if (params.top_k > 0 && params.top_k < vocab_size) {
    // The k-th largest key.
    std::nth_element(kept.begin(), kept.begin() + (params.top_k - 1), kept.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    threshold = std::max(threshold, kept[params.top_k - 1].first);
  }
  if (params.top_p < 1.0f) {
    kept.clear();
    uint64_t total = 0;
    for (int64_t i = 0; i < vocab_size; ++i) {
      const uint32_t key = OrderedKey(logits[i]);
      if (key < threshold) continue;
      const uint64_t w = Weight(logits[i], max_logit, params.temperature);
      kept.emplace_back(key, w);
      total += w;
    }
    std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    uint64_t target = static_cast<uint64_t>(std::ceil(static_cast<double>(params.top_p) * static_cast<double>(total)));
    target = std::max<uint64_t>(target, 1);
    // The largest key whose keys at or above it hold the target mass.
    uint64_t mass = 0;
    for (size_t i = 0; i < kept.size(); ++i) {
      mass += kept[i].second;
      const bool last_of_key = i + 1 == kept.size() || kept[i + 1].first != kept[i].first;
      if (last_of_key && mass >= target) {
        threshold = kept[i].first;
        break;
      }
    }
  }

  // Draw in id order over the kept tokens.
  uint64_t total = 0;
  for (int64_t i = 0; i < vocab_size; ++i) {
    if (OrderedKey(logits[i]) >= threshold) total += Weight(logits[i], max_logit, params.temperature);
  }
  const uint64_t draw = MulHigh(SplitMix64(params.seed ^ SplitMix64(counter)), total);
  uint64_t cumulative = 0;
  for (int64_t i = 0; i < vocab_size; ++i) {
    if (OrderedKey(logits[i]) < threshold) continue;
    cumulative += Weight(logits[i], max_logit, params.temperature);
    if (draw < cumulative) return static_cast<int32_t>(i);
  }
  return greedy;  // unreachable: the draw is below the total
}

}  // namespace lamina
