// When a sequence ends: the rules shared by single-process mode and the cluster's scheduler.
// Pure functions; thread-safe.
#ifndef LAMINA_COORDINATOR_SEQUENCE_STOP_CONDITIONS_H_
#define LAMINA_COORDINATOR_SEQUENCE_STOP_CONDITIONS_H_

#include <cstdint>
#include <vector>

#include "common/model_config/model_config.h"

namespace lamina {

enum class FinishReason { kNone, kEndOfSequence, kStopId, kStopString, kMaxTokens, kContextFull };
const char* FinishReasonName(FinishReason reason);

struct StopConditions {
  int32_t max_tokens = 16;
  bool ignore_eos = false;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
  int32_t min_tokens = 0;         // before this many tokens, only the budget and context end it
};

// Whether a sequence ends with `token`, its `generated`-th token, which would be fed back at
// `next_position`. End of sequence wins over stop ids, which win over the token budget, which
// wins over a full context; before min_tokens neither end of sequence nor stop ids count.
FinishReason CheckFinish(int32_t token, int32_t generated, int32_t next_position, const StopConditions& stop,
                         const ModelConfig& config);

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SEQUENCE_STOP_CONDITIONS_H_
