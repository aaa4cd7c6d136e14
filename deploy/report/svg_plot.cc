#include "deploy/report/svg_plot.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lamina::report {
namespace {

constexpr double kWidth = 720, kHeight = 440;
constexpr double kLeft = 80, kRight = 200, kTop = 50, kBottom = 60;  // margins; the legend sits right
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                                   "#7f7f7f"};

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

// A round step giving about five ticks up to `max`.
double NiceStep(double max) {
  const double raw = max / 5;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * magnitude >= raw) return m * magnitude;
  }
  return 10 * magnitude;
}

std::string Number(double v) {
  if (v == 0) return "0";
  if (std::fabs(v) >= 1e6) return absl::StrFormat("%.3gM", v / 1e6);
  if (std::fabs(v) >= 1e4) return absl::StrFormat("%.3gk", v / 1e3);
  return absl::StrFormat("%g", v);
}

}  // namespace

std::string RenderSvg(const LineChart& chart) {
  double x_min = chart.log2_x ? 1e300 : 0, x_max = 0, y_max = 0;
  for (const Series& s : chart.series) {
    for (const auto& [x, y] : s.points) {
      x_max = std::max(x_max, x);
      y_max = std::max(y_max, y);
      if (chart.log2_x && x > 0) x_min = std::min(x_min, x);
    }
  }
  if (chart.log2_x) {
    if (x_min > x_max) x_min = 1, x_max = 2;
    x_min = std::exp2(std::floor(std::log2(x_min)));
    x_max = std::exp2(std::ceil(std::log2(std::max(x_max, 2 * x_min))));
  } else if (x_max <= 0) {
    x_max = 1;
  }
  if (y_max <= 0) y_max = 1;
  const double y_step = NiceStep(y_max);
  y_max = std::ceil(y_max / y_step) * y_step;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto px = [&](double x) {
    const double f = chart.log2_x ? (std::log2(std::max(x, x_min)) - std::log2(x_min)) / (std::log2(x_max) - std::log2(x_min))
                                  : x / x_max;
    return kLeft + f * plot_w;
  };
  auto py = [&](double y) { return kTop + plot_h - y / y_max * plot_h; };

  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      kWidth, kHeight, kWidth, kHeight);
  absl::StrAppendFormat(&svg, "<text x=\"%.0f\" y=\"28\" font-size=\"15\" text-anchor=\"middle\">%s</text>\n",
                        kLeft + plot_w / 2, Escape(chart.title));
  // Grid and ticks.
  for (double y = 0; y <= y_max + y_step / 2; y += y_step) {
    absl::StrAppendFormat(&svg, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", kLeft,
                          py(y), kLeft + plot_w, py(y));
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", kLeft - 6, py(y) + 4,
                          Number(y));
  }
  std::vector<double> x_ticks;
  if (chart.log2_x) {
    for (double x = x_min; x <= x_max * 1.001; x *= 2) x_ticks.push_back(x);
  } else {
    const double step = NiceStep(x_max);
    for (double x = 0; x <= x_max + step / 2; x += step) x_ticks.push_back(x);
  }
  for (double x : x_ticks) {
    absl::StrAppendFormat(&svg, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", px(x), kTop,
                          px(x), kTop + plot_h);
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", px(x),
                          kTop + plot_h + 18, Number(x));
  }
  absl::StrAppendFormat(&svg, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#333\"/>\n",
                        kLeft, kTop, plot_w, plot_h);
  absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", kLeft + plot_w / 2,
                        kHeight - 18, Escape(chart.x_label));
  absl::StrAppendFormat(&svg,
                        "<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.1f)\">%s</text>\n",
                        kTop + plot_h / 2, kTop + plot_h / 2, Escape(chart.y_label));
  // Series and legend.
  for (size_t i = 0; i < chart.series.size(); ++i) {
    const Series& s = chart.series[i];
    const char* color = kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
    std::string points;
    for (const auto& [x, y] : s.points) absl::StrAppendFormat(&points, "%.1f,%.1f ", px(x), py(y));
    absl::StrAppendFormat(&svg, "<polyline class=\"series\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"%s\"/>\n",
                          color, s.dashed ? " stroke-dasharray=\"6 4\"" : "", points);
    for (const auto& [x, y] : s.points) {
      absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(x), py(y), color);
    }
    const double ly = kTop + 10 + 20 * i;
    absl::StrAppendFormat(&svg, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
                          kWidth - kRight + 15, ly, kWidth - kRight + 40, ly, color,
                          s.dashed ? " stroke-dasharray=\"6 4\"" : "");
    absl::StrAppendFormat(&svg, "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", kWidth - kRight + 46, ly + 4, Escape(s.name));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace lamina::report
