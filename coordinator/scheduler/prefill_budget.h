// How much of each prompt a step prefills (the topology's scheduler.chunked_prefill). The
// scheduler and the simulator that mirrors it (deploy/simulator) both split prompts this way.
#ifndef LAMINA_COORDINATOR_SCHEDULER_PREFILL_BUDGET_H_
#define LAMINA_COORDINATOR_SCHEDULER_PREFILL_BUDGET_H_

#include <algorithm>
#include <cstdint>

namespace lamina {

// The least a step prefills of its first unfinished prompt, even when the decodes take the whole
// token budget: a prefix-cache block, so that every prompt keeps moving.
inline constexpr int64_t kMinPrefillChunk = 16;

// One step's prompt tokens: what the token budget leaves after the step's decodes, handed to its
// unfinished prompts in order (the first at least kMinPrefillChunk). Without chunking, each prompt
// takes all it has to go. Plain value; thread-compatible.
class PrefillBudget {
 public:
  PrefillBudget(int64_t budget, int64_t decodes, bool chunked) : left_(budget - decodes), chunked_(chunked) {}

  // The tokens the step prefills of its next prompt, which has `rest` to go (0: none this step).
  int64_t Take(int64_t rest) {
    if (!chunked_) return rest;
    const int64_t chunk = std::min(rest, std::max(left_, first_ ? kMinPrefillChunk : int64_t{0}));
    first_ = false;
    left_ -= chunk;
    return chunk;
  }

 private:
  int64_t left_;  // negative when overdrawn
  bool chunked_;
  bool first_ = true;
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SCHEDULER_PREFILL_BUDGET_H_
