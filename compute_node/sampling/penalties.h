// Repetition, presence and frequency penalties (SamplingParams): the tokens a sequence has seen,
// and the edits its penalties make to a row of logits. The CPU reference for
// kernels/cuda/penalties.h, which applies the same edits with the same float operations.
//
// An edit of token t: logit' = (logit > 0 ? logit / divisor : logit * divisor) - subtract, with
// divisor = repetition_penalty for a token in the prompt or generated (1 otherwise), and subtract
// = frequency_penalty * (times generated) + presence_penalty (0 for a token never generated), as
// vLLM and Hugging Face define them; subtract is +infinity for a token min_tokens holds back.
// A row has at most one edit per token.
#ifndef LAMINA_COMPUTE_NODE_SAMPLING_PENALTIES_H_
#define LAMINA_COMPUTE_NODE_SAMPLING_PENALTIES_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "compute_node/sampling/sampler.h"

namespace lamina {

// The tokens of one sequence by position: the first `prompt_length` are its prompt, the rest were
// generated. Kept as one entry per distinct token, in the order first seen, so that a step's
// edits are a pass over a flat array. Thread-compatible.
class TokenHistory {
 public:
  explicit TokenHistory(int32_t prompt_length) : prompt_length_(prompt_length) {}

  // Counts `token` at `position`. A position below length() was counted already and is skipped,
  // so a step that is run again (after a failure) counts its tokens once.
  void Add(int32_t position, int32_t token);

  struct Entry {
    int32_t token;
    int32_t generated = 0;   // times generated
    bool in_prompt = false;  // appears in the prompt

    bool operator==(const Entry& o) const {
      return token == o.token && generated == o.generated && in_prompt == o.in_prompt;
    }
  };
  // One per distinct token, in the order first seen.
  const std::vector<Entry>& entries() const { return entries_; }
  // The token's entry, or null when the sequence has not seen it.
  const Entry* Find(int32_t token) const;
  // Positions counted so far (one past the last).
  int32_t length() const { return length_; }
  int32_t prompt_length() const { return prompt_length_; }
  // Tokens generated so far (counted past the prompt).
  int32_t generated() const { return length_ > prompt_length_ ? length_ - prompt_length_ : 0; }

 private:
  int32_t prompt_length_;
  int32_t length_ = 0;
  std::vector<Entry> entries_;
  absl::flat_hash_map<int32_t, int32_t> index_;  // token -> its entry
};

struct PenaltyEdit {
  int32_t token;
  float divisor;
  float subtract;

  bool operator==(const PenaltyEdit& o) const {
    return token == o.token && divisor == o.divisor && subtract == o.subtract;
  }
};

// Calls emit(PenaltyEdit) for each token of `history` that `params`' penalties change, in the
// history's order (none when the params have no penalties). Inline: the GPU backend writes the
// edits of a batch straight into its upload buffer.
template <typename Emit>
void ForEachPenaltyEdit(const SamplingParams& params, const TokenHistory& history, Emit&& emit) {
  if (!params.has_penalties()) return;
  const std::vector<int32_t>& held = params.min_tokens_stop_ids;
  const bool holding = params.holds_back_stops() && history.generated() < params.min_tokens;
  auto is_held = [&](int32_t token) { return holding && std::find(held.begin(), held.end(), token) != held.end(); };
  for (const TokenHistory::Entry& e : history.entries()) {
    float subtract =
        e.generated > 0 ? params.frequency_penalty * static_cast<float>(e.generated) + params.presence_penalty : 0.0f;
    if (is_held(e.token)) subtract = std::numeric_limits<float>::infinity();
    if (params.repetition_penalty != 1.0f || subtract != 0.0f)
      emit(PenaltyEdit{e.token, params.repetition_penalty, subtract});
  }
  if (!holding) return;
  for (size_t i = 0; i < held.size(); ++i) {  // those the history has not seen, once each
    const int32_t token = held[i];
    if (history.Find(token) == nullptr && std::find(held.begin(), held.begin() + i, token) == held.begin() + i) {
      emit(PenaltyEdit{token, 1.0f, std::numeric_limits<float>::infinity()});
    }
  }
}

// The most edits ForEachPenaltyEdit makes for a history with `entries` distinct tokens.
inline int64_t MostPenaltyEdits(const SamplingParams& params, int64_t entries) {
  return entries + static_cast<int64_t>(params.min_tokens_stop_ids.size());
}

// The edits of ForEachPenaltyEdit, as a list.
std::vector<PenaltyEdit> PenaltyEdits(const SamplingParams& params, const TokenHistory& history);

// One edited logit.
inline float EditLogit(float logit, const PenaltyEdit& edit) {
  return (logit > 0.0f ? logit / edit.divisor : logit * edit.divisor) - edit.subtract;
}

// A logit before ApplyPenalties edited it.
struct SavedLogit {
  int32_t token;
  float logit;
};

// Applies `params`' penalties for `history` to logits [vocab_size] in place (tokens outside the
// vocabulary are skipped), touching only the edited logits; returns their old values, which
// RestoreLogits puts back (log probabilities are of the raw logits).
std::vector<SavedLogit> ApplyPenalties(const SamplingParams& params, const TokenHistory& history, float* logits,
                                       int64_t vocab_size);
void RestoreLogits(const std::vector<SavedLogit>& saved, float* logits);

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_SAMPLING_PENALTIES_H_
