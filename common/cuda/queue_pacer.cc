#include "common/cuda/queue_pacer.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cuda/cuda_check.h"
#include "common/status/status_macros.h"

namespace lamina::cuda {
namespace {

// How long a paced thread sleeps between looks at the unit it waits for: far less than the units
// queued ahead take to run, and no core spent spinning.
constexpr absl::Duration kPoll = absl::Microseconds(50);

}  // namespace

absl::StatusOr<QueuePacer> QueuePacer::Create(int most_units) {
  if (most_units < 1) return absl::InvalidArgumentError(absl::StrCat("a queue pacer of ", most_units, " units"));
  QueuePacer pacer;
  for (int i = 0; i < most_units; ++i) {
    LAMINA_ASSIGN_OR_RETURN(Event end, Event::CreateForOrdering());
    pacer.ends_.push_back(std::move(end));
  }
  return pacer;
}

absl::Status QueuePacer::Paced(cudaStream_t stream) {
  const Event& slot = ends_[units_ % static_cast<int64_t>(ends_.size())];
  // The slot last marked the end of the unit most_units back (nothing yet, in the first round).
  if (units_ >= static_cast<int64_t>(ends_.size())) {
    cudaError_t state;
    while ((state = cudaEventQuery(slot.get())) == cudaErrorNotReady) absl::SleepFor(kPoll);
    LAMINA_CUDA_RETURN_IF_ERROR(state);
  }
  LAMINA_RETURN_IF_ERROR(slot.Record(stream));
  ++units_;
  return absl::OkStatus();
}

}  // namespace lamina::cuda
