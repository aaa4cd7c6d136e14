#include "compute_node/sampling/penalties.h"

namespace lamina {

void TokenHistory::Add(int32_t position, int32_t token) {
  if (position < length_) return;
  length_ = position + 1;
  auto [it, added] = index_.try_emplace(token, static_cast<int32_t>(entries_.size()));
  if (added) entries_.push_back(Entry{token});
  Entry& entry = entries_[it->second];
  if (position < prompt_length_) {
    entry.in_prompt = true;
  } else {
    ++entry.generated;
  }
}

const TokenHistory::Entry* TokenHistory::Find(int32_t token) const {
  auto it = index_.find(token);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

std::vector<PenaltyEdit> PenaltyEdits(const SamplingParams& params, const TokenHistory& history) {
  std::vector<PenaltyEdit> edits;
  ForEachPenaltyEdit(params, history, [&](const PenaltyEdit& e) { edits.push_back(e); });
  return edits;
}

std::vector<SavedLogit> ApplyPenalties(const SamplingParams& params, const TokenHistory& history, float* logits,
                                       int64_t vocab_size) {
  std::vector<SavedLogit> saved;
  ForEachPenaltyEdit(params, history, [&](const PenaltyEdit& edit) {
    if (edit.token < 0 || edit.token >= vocab_size) return;
    saved.push_back({edit.token, logits[edit.token]});
    logits[edit.token] = EditLogit(logits[edit.token], edit);
  });
  return saved;
}

void RestoreLogits(const std::vector<SavedLogit>& saved, float* logits) {
  for (const SavedLogit& s : saved) logits[s.token] = s.logit;
}

}  // namespace lamina
