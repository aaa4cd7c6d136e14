// Line charts as standalone SVG files, for experiment reports (no plotting library needed: the
// charts are a few axes, lines and labels). Axes start at zero unless `log2_x` is set, ticks are
// round numbers, and every series has a marker per point and a legend entry.
// Plain values; thread-compatible.
#ifndef LAMINA_DEPLOY_REPORT_SVG_PLOT_H_
#define LAMINA_DEPLOY_REPORT_SVG_PLOT_H_

#include <string>
#include <utility>
#include <vector>

namespace lamina::report {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in order
  bool dashed = false;
};

struct LineChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log2_x = false;  // batch sizes and context lengths are powers of two
  std::vector<Series> series;
};

std::string RenderSvg(const LineChart& chart);

}  // namespace lamina::report

#endif  // LAMINA_DEPLOY_REPORT_SVG_PLOT_H_
