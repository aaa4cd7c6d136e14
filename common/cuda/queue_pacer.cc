#include "common/cuda/queue_pacer.h"

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/status/status_macros.h"

namespace lamina::cuda {

absl::StatusOr<QueuePacer> QueuePacer::Create(int most_units) {
  if (most_units < 1) return absl::InvalidArgumentError(absl::StrCat("a queue pacer of ", most_units, " units"));
  QueuePacer pacer;
  for (int i = 0; i < most_units; ++i) {
    LAMINA_ASSIGN_OR_RETURN(Event end, Event::CreateForSleepingWaits());
    pacer.ends_.push_back(std::move(end));
  }
  return pacer;
}

absl::Status QueuePacer::Paced(cudaStream_t stream) {
  const Event& slot = ends_[units_ % static_cast<int64_t>(ends_.size())];
  // The slot last marked the end of the unit most_units back (nothing yet, in the first round).
  if (units_ >= static_cast<int64_t>(ends_.size())) LAMINA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.get()));
  LAMINA_RETURN_IF_ERROR(slot.Record(stream));
  ++units_;
  return absl::OkStatus();
}

}  // namespace lamina::cuda
