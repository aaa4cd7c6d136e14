// Reads a Prometheus text-format page as a scraper would, for tests of Lamina's /metrics: checks
// its grammar independently of the code that wrote it, and gives each sample's value.
#ifndef LAMINA_TESTS_SUPPORT_PROMETHEUS_PAGE_H_
#define LAMINA_TESTS_SUPPORT_PROMETHEUS_PAGE_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace lamina::testing {

// Each sample's value, keyed by its series as written: `name` or `name{label="value",...}`.
// InvalidArgument, naming the line, when the page breaks the format: a sample before its family's
// TYPE line or of another family, a family declared twice, a malformed line or value, a series
// twice, or a histogram whose buckets do not grow or whose `+Inf` bucket is not its `_count`.
absl::StatusOr<std::map<std::string, double>> ParsePrometheusPage(const std::string& page);

}  // namespace lamina::testing

#endif  // LAMINA_TESTS_SUPPORT_PROMETHEUS_PAGE_H_
