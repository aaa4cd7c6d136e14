#include "common/metrics/prometheus_text.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "tests/support/prometheus_page.h"

namespace lamina {
namespace {

TEST(PrometheusTextTest, FamiliesAndLabelledSamples) {
  PrometheusText out;
  out.Single("lamina_requests_waiting", MetricType::kGauge, "Requests queued.", 3);
  out.Family("lamina_kv_slots_used", MetricType::kGauge, "Token slots in use.");
  out.Sample({{"node", "memory-0"}}, 1024);
  out.Sample({{"node", "memory-1"}, {"role", "memory"}}, 0);
  out.Family("lamina_requests_total", MetricType::kCounter, "Requests ended.");
  EXPECT_EQ(out.text(),
            "# HELP lamina_requests_waiting Requests queued.\n"
            "# TYPE lamina_requests_waiting gauge\n"
            "lamina_requests_waiting 3\n"
            "# HELP lamina_kv_slots_used Token slots in use.\n"
            "# TYPE lamina_kv_slots_used gauge\n"
            "lamina_kv_slots_used{node=\"memory-0\"} 1024\n"
            "lamina_kv_slots_used{node=\"memory-1\",role=\"memory\"} 0\n"
            "# HELP lamina_requests_total Requests ended.\n"
            "# TYPE lamina_requests_total counter\n");
}

TEST(PrometheusTextTest, LabelValuesAreEscaped) {
  PrometheusText out;
  out.Family("x", MetricType::kGauge, "h");
  out.Sample({{"path", "a\\b \"c\"\nd"}}, 1);
  EXPECT_EQ(out.text(), "# HELP x h\n# TYPE x gauge\nx{path=\"a\\\\b \\\"c\\\"\\nd\"} 1\n");
}

TEST(PrometheusTextTest, HistogramBucketsAreCumulativeWithInfLast) {
  Histogram h({0.005, 0.1, 2.5});
  for (double v : {0.00390625, 0.0625, 0.09375, 3.0}) h.Observe(v);  // exact in binary, so is their sum
  PrometheusText out;
  out.Family("lamina_ttft_seconds", MetricType::kHistogram, "Time to first token.");
  out.HistogramSamples({{"model", "m"}}, h);
  EXPECT_EQ(out.text(),
            "# HELP lamina_ttft_seconds Time to first token.\n"
            "# TYPE lamina_ttft_seconds histogram\n"
            "lamina_ttft_seconds_bucket{model=\"m\",le=\"0.005\"} 1\n"
            "lamina_ttft_seconds_bucket{model=\"m\",le=\"0.1\"} 3\n"
            "lamina_ttft_seconds_bucket{model=\"m\",le=\"2.5\"} 3\n"
            "lamina_ttft_seconds_bucket{model=\"m\",le=\"+Inf\"} 4\n"
            "lamina_ttft_seconds_sum{model=\"m\"} 3.16015625\n"
            "lamina_ttft_seconds_count{model=\"m\"} 4\n");
}

TEST(PrometheusTextTest, NumbersReadBackExactly) {
  EXPECT_EQ(PrometheusNumber(0), "0");
  EXPECT_EQ(PrometheusNumber(-2), "-2");
  EXPECT_EQ(PrometheusNumber(0.1), "0.1");
  EXPECT_EQ(PrometheusNumber(123456789012), "123456789012");
  EXPECT_EQ(PrometheusNumber(0.0005), "0.0005");
  EXPECT_EQ(PrometheusNumber(1e-9), "1e-09");
  EXPECT_EQ(PrometheusNumber(2.5e17), "2.5e+17");
  EXPECT_EQ(PrometheusNumber(0.00012345678901234567), "0.00012345678901234567");
  EXPECT_EQ(PrometheusNumber(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(PrometheusNumber(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(PrometheusNumber(std::nan("")), "NaN");
  const double third = 1.0 / 3;
  EXPECT_EQ(std::stod(PrometheusNumber(third)), third);
}

TEST(PrometheusTextDeathTest, NamesAreCheckedAndFamiliesStartOnce) {
  EXPECT_DEATH(PrometheusText().Family("9lives", MetricType::kGauge, "h"), "LAMINA_CHECK failed");
  EXPECT_DEATH(PrometheusText().Family("a-b", MetricType::kGauge, "h"), "LAMINA_CHECK failed");
  EXPECT_DEATH(PrometheusText().Family("a", MetricType::kGauge, "two\nlines"), "LAMINA_CHECK failed");
  EXPECT_DEATH(
      {
        PrometheusText out;
        out.Family("a", MetricType::kGauge, "h");
        out.Family("a", MetricType::kGauge, "h");
      },
      "LAMINA_CHECK failed");
  EXPECT_DEATH(
      {
        PrometheusText out;
        out.Family("a", MetricType::kGauge, "h");
        out.Sample({{"bad:label", "v"}}, 1);
      },
      "LAMINA_CHECK failed");
  EXPECT_DEATH(
      {
        PrometheusText out;
        out.Family("a", MetricType::kHistogram, "h");
        out.Sample({}, 1);
      },
      "LAMINA_CHECK failed");
}

// The test support's reader, which the /metrics tests rely on, accepts what the writer writes and
// refuses what breaks the format.
TEST(PrometheusPageTest, ReadsValidPagesAndRefusesBrokenOnes) {
  Histogram h({1, 2});
  h.Observe(1.5);
  PrometheusText out;
  out.Single("a_total", MetricType::kCounter, "A.", 4);
  out.Family("b", MetricType::kHistogram, "B.");
  out.HistogramSamples({{"x", "y"}}, h);
  absl::StatusOr<std::map<std::string, double>> page = testing::ParsePrometheusPage(out.text());
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->at("a_total"), 4);
  EXPECT_EQ(page->at(R"(b_bucket{x="y",le="1"})"), 0);
  EXPECT_EQ(page->at(R"(b_bucket{x="y",le="2"})"), 1);
  EXPECT_EQ(page->at(R"(b_count{x="y"})"), 1);

  const std::pair<const char*, const char*> broken[] = {
      {"a 1", "not end with a newline"},
      {"a 1\n", "a sample before any TYPE line"},
      {"# TYPE a gauge\na 1\na 2\n", "series written twice"},
      {"# TYPE a gauge\nb 1\n", "outside its family"},
      {"# TYPE a gauge\na one\n", "not a number"},
      {"# TYPE a gauge\na{x=\"1} 1\n", "not a sample line"},
      {"# TYPE a gauge\n# TYPE a gauge\n", "declared twice"},
      {"# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n", "below the one before"},
      {"# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 3\n", "not the +Inf bucket"},
  };
  for (const auto& [text, why] : broken) {
    absl::StatusOr<std::map<std::string, double>> parsed = testing::ParsePrometheusPage(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_NE(parsed.status().message().find(why), std::string::npos) << parsed.status();
  }
}

}  // namespace
}  // namespace lamina
