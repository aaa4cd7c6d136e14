// Writes metrics in Prometheus's text exposition format (version 0.0.4, what a Prometheus server
// scrapes from /metrics):
//
//   # HELP lamina_requests_running Requests being generated.
//   # TYPE lamina_requests_running gauge
//   lamina_requests_running 3
//   lamina_kv_slots_used{node="memory-0"} 1024
//
// A family (its HELP and TYPE lines) comes first, then its samples, before the next family. Label
// values are escaped (backslash, double quote, newline); numbers are written as the shortest text
// that reads back as the same double (in plain decimals from 1e-4 to 1e16), with +Inf, -Inf and
// NaN as Prometheus spells them.
// Thread-compatible.
#ifndef LAMINA_COMMON_METRICS_PROMETHEUS_TEXT_H_
#define LAMINA_COMMON_METRICS_PROMETHEUS_TEXT_H_

#include <string>
#include <utility>
#include <vector>

#include "common/metrics/histogram.h"

namespace lamina {

enum class MetricType { kCounter, kGauge, kHistogram };

// A sample's labels, written in this order: {name, value} pairs.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class PrometheusText {
 public:
  // Starts a family. `name` must be a valid metric name and not have been started before, and
  // `help` is one line of text (both checked: they are the program's own constants).
  void Family(const std::string& name, MetricType type, const std::string& help);
  // A sample of the current family, a counter or a gauge.
  void Sample(const MetricLabels& labels, double value);
  // A histogram's samples under the current histogram family: its buckets as cumulative
  // `_bucket` lines with an `le` label (the last one `+Inf`), then `_sum` and `_count`.
  void HistogramSamples(const MetricLabels& labels, const Histogram& histogram);
  // A family with one unlabelled sample.
  void Single(const std::string& name, MetricType type, const std::string& help, double value);

  const std::string& text() const { return text_; }

 private:
  void Line(const std::string& name, const MetricLabels& labels, double value);

  std::string text_;
  std::string family_;
  MetricType type_ = MetricType::kGauge;
  std::vector<std::string> started_;
};

// `value` as the page writes it.
std::string PrometheusNumber(double value);

}  // namespace lamina

#endif  // LAMINA_COMMON_METRICS_PROMETHEUS_TEXT_H_
