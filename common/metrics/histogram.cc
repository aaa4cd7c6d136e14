#include "common/metrics/histogram.h"

#include <algorithm>
#include <cmath>

#include "common/status/status_macros.h"

namespace lamina {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), buckets_(bounds_.size() + 1, 0) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    LAMINA_CHECK(std::isfinite(bounds_[i]));
    LAMINA_CHECK(i == 0 || bounds_[i - 1] < bounds_[i]);
  }
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  // The first bound at or above the value: a value equal to a bound belongs to that bound's bucket.
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++buckets_[bucket];
  ++count_;
  sum_ += value;
}

}  // namespace lamina
