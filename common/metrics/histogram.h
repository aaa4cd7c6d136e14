// A distribution of observations in fixed buckets, kept as a Prometheus histogram keeps one: a
// bucket counts the observations above the previous bucket's upper bound and at most its own; one
// more bucket, above the last bound, takes the rest. Also the count and sum of all observations.
// Thread-compatible: the owner guards it.
#ifndef LAMINA_COMMON_METRICS_HISTOGRAM_H_
#define LAMINA_COMMON_METRICS_HISTOGRAM_H_

#include <cstdint>
#include <vector>

namespace lamina {

class Histogram {
 public:
  // `bounds`: the upper bounds, finite and strictly increasing (a broken list is a programming
  // error, checked).
  explicit Histogram(std::vector<double> bounds);

  // A NaN is not counted.
  void Observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Observations in each bucket: bounds().size() + 1 of them, the last above every bound.
  const std::vector<int64_t>& buckets() const { return buckets_; }
  int64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> buckets_;
  int64_t count_ = 0;
  double sum_ = 0;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_METRICS_HISTOGRAM_H_
