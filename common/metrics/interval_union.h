// Busy time from intervals learned after the fact: a GPU compute node's stretches of computing,
// timed on the device and reported once each pass's work is done, by several streams (lanes) whose
// work overlaps. Each instant counts once, however many intervals cover it, and whatever order
// they arrive in.
//
// Intervals are kept merged for `horizon` past the latest end seen, then settled into a sum: an
// interval arriving later than that (a pass longer than the horizon) is clipped to the settled
// boundary, so an overlap is never counted twice, at worst a little busy time is left out.
// Thread-safe.
#ifndef LAMINA_COMMON_METRICS_INTERVAL_UNION_H_
#define LAMINA_COMMON_METRICS_INTERVAL_UNION_H_

#include <map>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/metrics/busy_meter.h"

namespace lamina {

class IntervalUnion {
 public:
  explicit IntervalUnion(absl::Duration horizon = absl::Seconds(30));

  // [begin, end); an empty or reversed interval is ignored.
  void Add(absl::Time begin, absl::Time end);
  // Busy seconds so far (count: intervals added) and the clock since construction.
  BusyMeter::Snapshot Read() const;

 private:
  void SettleBefore(absl::Time boundary);  // mu_ held

  const absl::Duration horizon_;
  const absl::Time start_;
  mutable std::mutex mu_;
  std::map<absl::Time, absl::Time> open_ ABSL_GUARDED_BY(mu_);  // disjoint, not touching: begin -> end
  absl::Duration open_total_ ABSL_GUARDED_BY(mu_);  // summed lengths of open_
  absl::Duration settled_ ABSL_GUARDED_BY(mu_);  // busy time before settled_until_
  absl::Time settled_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time latest_end_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_METRICS_INTERVAL_UNION_H_
