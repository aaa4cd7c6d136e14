// Busy time of a node, for utilisation reports: the work a node does (a compute step, an attention
// request, a round trip) is timed and summed. Readers take a Snapshot: the busy seconds and count so
// far and the meter's own clock (seconds since it was made), so that utilisation over any window is
// Δbusy ÷ Δclock between two snapshots, however late they were read.
// Thread-safe; Add never blocks.
#ifndef LAMINA_COMMON_METRICS_BUSY_METER_H_
#define LAMINA_COMMON_METRICS_BUSY_METER_H_

#include <atomic>
#include <cstdint>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace lamina {

class BusyMeter {
 public:
  struct Snapshot {
    double busy_seconds = 0;  // summed durations
    int64_t count = 0;        // how many were added
    double clock_seconds = 0; // seconds since the meter was made, when read
  };

  BusyMeter() : start_(absl::Now()) {}

  void Add(absl::Duration duration) {
    busy_ns_.fetch_add(absl::ToInt64Nanoseconds(duration), std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
  }
  Snapshot Read() const {
    return {busy_ns_.load(std::memory_order_relaxed) * 1e-9, count_.load(std::memory_order_relaxed),
            absl::ToDoubleSeconds(absl::Now() - start_)};
  }

 private:
  const absl::Time start_;
  std::atomic<int64_t> busy_ns_{0};
  std::atomic<int64_t> count_{0};
};

// Adds the time from construction to destruction to a meter (null: nothing).
class ScopedBusy {
 public:
  explicit ScopedBusy(BusyMeter* meter) : meter_(meter), start_(absl::Now()) {}
  ~ScopedBusy() {
    if (meter_ != nullptr) meter_->Add(absl::Now() - start_);
  }
  ScopedBusy(const ScopedBusy&) = delete;
  ScopedBusy& operator=(const ScopedBusy&) = delete;

 private:
  BusyMeter* meter_;
  absl::Time start_;
};

// Time during which at least one of several activities runs, each counted once however many
// overlap: a compute node's batch runners computing at once. Each activity calls Enter() when it starts
// and Leave() when it stops (or pauses, as while waiting on attention); calls must pair up.
// Thread-safe.
class BusyUnion {
 public:
  BusyUnion() : start_(absl::Now()) {}

  void Enter() {
    std::lock_guard<std::mutex> lock(mu_);
    if (active_++ == 0) since_ = absl::Now();
  }
  void Leave() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--active_ == 0) busy_ += absl::Now() - since_;
  }
  // Busy seconds so far, counting the interval under way; `count` is unused (0).
  BusyMeter::Snapshot Read() const {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time now = absl::Now();
    const absl::Duration busy = busy_ + (active_ > 0 ? now - since_ : absl::ZeroDuration());
    return {absl::ToDoubleSeconds(busy), 0, absl::ToDoubleSeconds(now - start_)};
  }

 private:
  const absl::Time start_;
  mutable std::mutex mu_;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time since_ ABSL_GUARDED_BY(mu_);
  absl::Duration busy_ ABSL_GUARDED_BY(mu_);
};

// Enter() on construction, Leave() on destruction (null: nothing).
class ScopedActive {
 public:
  explicit ScopedActive(BusyUnion* meter) : meter_(meter) {
    if (meter_ != nullptr) meter_->Enter();
  }
  ~ScopedActive() {
    if (meter_ != nullptr) meter_->Leave();
  }
  ScopedActive(const ScopedActive&) = delete;
  ScopedActive& operator=(const ScopedActive&) = delete;

 private:
  BusyUnion* meter_;
};

// The reverse, for a pause inside an active stretch: Leave() now, Enter() again on destruction.
class ScopedPause {
 public:
  explicit ScopedPause(BusyUnion* meter) : meter_(meter) {
    if (meter_ != nullptr) meter_->Leave();
  }
  ~ScopedPause() {
    if (meter_ != nullptr) meter_->Enter();
  }
  ScopedPause(const ScopedPause&) = delete;
  ScopedPause& operator=(const ScopedPause&) = delete;

 private:
  BusyUnion* meter_;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_METRICS_BUSY_METER_H_
