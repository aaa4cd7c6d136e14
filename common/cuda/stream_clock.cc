#include "common/cuda/stream_clock.h"

#include "common/status/status_macros.h"

namespace lamina::cuda {

absl::StatusOr<StreamClock> StreamClock::Create(size_t marks) {
  StreamClock clock;
  clock.events_.reserve(marks);
  for (size_t i = 0; i < marks; ++i) {
    LAMINA_ASSIGN_OR_RETURN(Event event, Event::Create());
    clock.events_.push_back(std::move(event));
  }
  return clock;
}

absl::Status StreamClock::Mark(bool computing, cudaStream_t stream) {
  if (computing == computing_) return absl::OkStatus();
  computing_ = computing;
  if (marks_ == events_.size()) {
    dropped_ = true;
    return absl::OkStatus();
  }
  LAMINA_RETURN_IF_ERROR(events_[marks_].Record(stream));
  ++marks_;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StreamClock::Interval>> StreamClock::Take(absl::Time done_at) {
  const size_t marks = marks_;
  const bool open = computing_;
  const bool dropped = dropped_;
  Clear();
  if (open) return absl::FailedPreconditionError("a stream's computing stretch was read before its end was marked");
  std::vector<Interval> intervals;
  if (marks == 0 || dropped) return intervals;
  const Event& last = events_[marks - 1];
  auto host_time = [&](const Event& mark) -> absl::StatusOr<absl::Time> {
    LAMINA_ASSIGN_OR_RETURN(const float before_last_ms, last.ElapsedSince(mark));
    return done_at - absl::Microseconds(static_cast<double>(before_last_ms) * 1e3);
  };
  for (size_t i = 0; i + 1 < marks; i += 2) {
    LAMINA_ASSIGN_OR_RETURN(const absl::Time start, host_time(events_[i]));
    LAMINA_ASSIGN_OR_RETURN(const absl::Time stop, host_time(events_[i + 1]));
    intervals.emplace_back(start, stop);
  }
  return intervals;
}

void StreamClock::Clear() {
  marks_ = 0;
  computing_ = false;
  dropped_ = false;
}

}  // namespace lamina::cuda
