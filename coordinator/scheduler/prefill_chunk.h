// How much of a prompt a step prefills under chunked prefill (the topology's
// scheduler.chunked_prefill). The scheduler and the simulator that mirrors it (deploy/simulator)
// both split prompts this way.
#ifndef LAMINA_COORDINATOR_SCHEDULER_PREFILL_CHUNK_H_
#define LAMINA_COORDINATOR_SCHEDULER_PREFILL_CHUNK_H_

#include <algorithm>
#include <cstdint>

namespace lamina {

// The least a step prefills of its first unfinished prompt, even when the decodes take the whole
// token budget: a prefix-cache block, so that every prompt keeps moving.
inline constexpr int64_t kMinPrefillChunk = 16;

// The tokens a step prefills of a prompt with `rest` tokens to go, when the decodes and the prompts
// before it in the step leave `left` of the token budget (negative when overdrawn); `first`: no
// prompt comes before it in the step.
inline int64_t PrefillChunk(int64_t rest, int64_t left, bool first) {
  return std::min(rest, std::max(left, first ? kMinPrefillChunk : int64_t{0}));
}

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SCHEDULER_PREFILL_CHUNK_H_
