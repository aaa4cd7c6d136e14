#include "common/metrics/interval_union.h"

#include <algorithm>
#include <iterator>

namespace lamina {

IntervalUnion::IntervalUnion(absl::Duration horizon) : horizon_(horizon), start_(absl::Now()) {}

void IntervalUnion::Add(absl::Time begin, absl::Time end) {
  std::lock_guard<std::mutex> lock(mu_);
  ++count_;
  begin = std::max(begin, settled_until_);
  if (end <= begin) return;
  // Merge with every open interval that overlaps or touches [begin, end).
  auto it = open_.upper_bound(begin);
  if (it != open_.begin() && std::prev(it)->second >= begin) --it;
  while (it != open_.end() && it->first <= end) {
    begin = std::min(begin, it->first);
    end = std::max(end, it->second);
    open_total_ -= it->second - it->first;
    it = open_.erase(it);
  }
  open_.emplace(begin, end);
  open_total_ += end - begin;
  latest_end_ = std::max(latest_end_, end);
  SettleBefore(latest_end_ - horizon_);
}

void IntervalUnion::SettleBefore(absl::Time boundary) {
  if (boundary <= settled_until_) return;
  while (!open_.empty() && open_.begin()->first < boundary) {
    auto first = open_.begin();
    const absl::Time begin = first->first;
    const absl::Time end = first->second;
    open_total_ -= end - begin;
    open_.erase(first);
    if (end <= boundary) {
      settled_ += end - begin;
    } else {  // straddles the boundary: settle the part before it
      settled_ += boundary - begin;
      open_.emplace(boundary, end);
      open_total_ += end - boundary;
      break;
    }
  }
  settled_until_ = boundary;
}

BusyMeter::Snapshot IntervalUnion::Read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {absl::ToDoubleSeconds(settled_ + open_total_), count_, absl::ToDoubleSeconds(absl::Now() - start_)};
}

}  // namespace lamina
