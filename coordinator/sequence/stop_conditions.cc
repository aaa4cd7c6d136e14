#include "coordinator/sequence/stop_conditions.h"

#include <algorithm>

namespace lamina {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kEndOfSequence:
      return "end_of_sequence";
    case FinishReason::kStopId:
    case FinishReason::kStopString:
      return "stop";
    case FinishReason::kMaxTokens:
      return "length";
    case FinishReason::kContextFull:
      return "context_full";
  }
  return "?";
}

FinishReason CheckFinish(int32_t token, int32_t generated, int32_t next_position, const StopConditions& stop,
                         const ModelConfig& config) {
  const auto& eos = config.eos_token_ids;
  const bool stops_count = generated >= stop.min_tokens;
  if (stops_count && !stop.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) {
    return FinishReason::kEndOfSequence;
  }
  if (stops_count && std::find(stop.stop_ids.begin(), stop.stop_ids.end(), token) != stop.stop_ids.end()) {
    return FinishReason::kStopId;
  }
  if (generated >= stop.max_tokens) return FinishReason::kMaxTokens;
  if (next_position >= config.max_position_embeddings) return FinishReason::kContextFull;
  return FinishReason::kNone;
}

}  // namespace lamina
