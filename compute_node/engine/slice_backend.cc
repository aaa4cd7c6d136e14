#include "compute_node/engine/slice_backend.h"

#include <vector>

#include "common/status/status_macros.h"
#include "compute_node/sampling/penalties.h"

namespace lamina {

absl::Status SliceBackend::RunLastAndSample(absl::Span<const TokenDraw> draws, int32_t* tokens,
                                            TokenLogprobs* logprobs) {
  std::vector<int64_t> rows;
  rows.reserve(draws.size());
  for (const TokenDraw& d : draws) rows.push_back(d.row);
  Tensor logits;
  LAMINA_RETURN_IF_ERROR(RunLast(rows, &logits));
  for (size_t i = 0; i < draws.size(); ++i) {
    float* row = logits.row(static_cast<int64_t>(i));  // the draw's own copy of its row
    std::vector<SavedLogit> saved;
    if (draws[i].params.has_penalties()) {
      if (draws[i].history == nullptr) return absl::InternalError("a draw with penalties has no token history");
      saved = ApplyPenalties(draws[i].params, *draws[i].history, row, logits.dim(1));
    }
    tokens[i] = SampleToken(row, logits.dim(1), draws[i].params, draws[i].counter);
    RestoreLogits(saved, row);  // log probabilities are of the raw logits
    if (logprobs != nullptr && draws[i].params.wants_logprobs()) {
      logprobs[i] = ComputeLogprobs(row, logits.dim(1), tokens[i], draws[i].params.top_logprobs);
    }
  }
  return absl::OkStatus();
}

}  // namespace lamina
