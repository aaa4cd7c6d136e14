#include "compute_node/sampling/penalties.h"

namespace lamina {

void TokenHistory::Add(int32_t position, int32_t token) {
  if (position < length_) return;
  length_ = position + 1;
  Seen& seen = seen_[token];
  if (position < prompt_length_) {
    seen.in_prompt = true;
  } else {
    ++seen.generated;
  }
}

std::vector<PenaltyEdit> PenaltyEdits(const SamplingParams& params, const TokenHistory& history) {
  std::vector<PenaltyEdit> edits;
  if (!params.has_penalties()) return edits;
  edits.reserve(history.seen().size());
  for (const auto& [token, seen] : history.seen()) {
    const float subtract = seen.generated > 0
                               ? params.frequency_penalty * static_cast<float>(seen.generated) + params.presence_penalty
                               : 0.0f;
    const PenaltyEdit edit{token, params.repetition_penalty, subtract};
    if (edit.divisor != 1.0f || edit.subtract != 0.0f) edits.push_back(edit);
  }
  return edits;
}

void ApplyPenalties(const std::vector<PenaltyEdit>& edits, float* logits, int64_t vocab_size) {
  for (const PenaltyEdit& edit : edits) {
    if (edit.token < 0 || edit.token >= vocab_size) continue;
    logits[edit.token] = EditLogit(logits[edit.token], edit);
  }
}

}  // namespace lamina
