#include "coordinator/scheduler/step_stagger.h"

#include <algorithm>

namespace lamina {
namespace {

// Weight of the newest decode step in the running mean.
constexpr double kNewest = 0.2;

}  // namespace

StepStagger::StepStagger(int batches, int64_t layers)
    : layers_(std::max<int64_t>(1, layers)), sent_(std::max(1, batches), absl::InfinitePast()) {}

void StepStagger::Sent(int batch, absl::Time when) {
  if (batch >= 0 && batch < static_cast<int>(sent_.size())) sent_[batch] = when;
}

void StepStagger::DecodeStepTook(absl::Duration duration) {
  if (duration <= absl::ZeroDuration()) return;
  step_ = step_ == absl::ZeroDuration() ? duration : step_ * (1 - kNewest) + duration * kNewest;
}

absl::Duration StepStagger::offset() const {
  return step_ / static_cast<double>(layers_ * static_cast<int64_t>(sent_.size()));
}

absl::Duration StepStagger::Hold(int batch, absl::Time now) const {
  if (sent_.size() < 2 || step_ == absl::ZeroDuration()) return absl::ZeroDuration();
  absl::Time latest_other = absl::InfinitePast();
  for (int b = 0; b < static_cast<int>(sent_.size()); ++b) {
    if (b != batch) latest_other = std::max(latest_other, sent_[b]);
  }
  if (latest_other == absl::InfinitePast()) return absl::ZeroDuration();
  return std::max(absl::ZeroDuration(), latest_other + offset() - now);
}

}  // namespace lamina
