#include "deploy/report/svg_plot.h"

#include "gtest/gtest.h"

namespace lamina::report {
namespace {

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(SvgPlotTest, OneLinePerSeriesAndOneMarkerPerPoint) {
  LineChart chart;
  chart.title = "a < b & c";
  chart.x_label = "batch";
  chart.y_label = "tokens/s";
  chart.log2_x = true;
  chart.series = {{"colocated", {{1, 10}, {4, 30}, {16, 35}}, true}, {"offloaded", {{1, 8}, {4, 32}}, false}};
  const std::string svg = RenderSvg(chart);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(Count(svg, "class=\"series\""), 2);
  EXPECT_EQ(Count(svg, "<circle"), 5);
  EXPECT_NE(svg.find("a &lt; b &amp; c"), std::string::npos);
  EXPECT_NE(svg.find(">offloaded<"), std::string::npos);
  EXPECT_EQ(Count(svg, "stroke-dasharray"), 2);  // the dashed series and its legend entry
}

}  // namespace
}  // namespace lamina::report
