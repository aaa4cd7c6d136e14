#include "common/metrics/prometheus_text.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

namespace lamina {
namespace {

bool ValidName(const std::string& name, bool colons) {
  if (name.empty() || absl::ascii_isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [colons](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || (colons && c == ':');
  });
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

std::string PrometheusNumber(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Plain decimals where they stay short (bucket bounds read as 0.0005, not 5e-04), else whichever
  // form is shortest.
  char buffer[64];
  const double magnitude = std::fabs(value);
  const std::to_chars_result written =
      value == 0 || (magnitude >= 1e-4 && magnitude < 1e16)
          ? std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::fixed)
          : std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, written.ptr);
}

void PrometheusText::Family(const std::string& name, MetricType type, const std::string& help) {
  LAMINA_CHECK(ValidName(name, /*colons=*/true));
  LAMINA_CHECK(std::find(started_.begin(), started_.end(), name) == started_.end());
  LAMINA_CHECK(help.find('\n') == std::string::npos && help.find('\\') == std::string::npos);
  started_.push_back(name);
  family_ = name;
  type_ = type;
  absl::StrAppend(&text_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", TypeName(type), "\n");
}

void PrometheusText::Sample(const MetricLabels& labels, double value) {
  LAMINA_CHECK(!family_.empty() && type_ != MetricType::kHistogram);
  Line(family_, labels, value);
}

void PrometheusText::HistogramSamples(const MetricLabels& labels, const Histogram& histogram) {
  LAMINA_CHECK(!family_.empty() && type_ == MetricType::kHistogram);
  MetricLabels with_le = labels;
  with_le.emplace_back("le", "");
  int64_t cumulative = 0;
  for (size_t i = 0; i < histogram.buckets().size(); ++i) {
    cumulative += histogram.buckets()[i];
    const bool last = i == histogram.bounds().size();
    with_le.back().second = last ? "+Inf" : PrometheusNumber(histogram.bounds()[i]);
    Line(family_ + "_bucket", with_le, static_cast<double>(cumulative));
  }
  Line(family_ + "_sum", labels, histogram.sum());
  Line(family_ + "_count", labels, static_cast<double>(histogram.count()));
}

void PrometheusText::Single(const std::string& name, MetricType type, const std::string& help, double value) {
  Family(name, type, help);
  Sample({}, value);
}

void PrometheusText::Line(const std::string& name, const MetricLabels& labels, double value) {
  text_ += name;
  if (!labels.empty()) {
    text_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      LAMINA_CHECK(ValidName(labels[i].first, /*colons=*/false));
      absl::StrAppend(&text_, i > 0 ? "," : "", labels[i].first, "=\"", EscapeLabelValue(labels[i].second), "\"");
    }
    text_ += '}';
  }
  absl::StrAppend(&text_, " ", PrometheusNumber(value), "\n");
}

}  // namespace lamina
