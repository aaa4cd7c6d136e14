// The planner check of an experiment report: where more batches than compute nodes take turns on
// them, the analytic model overlaps compute and attention, so such a topology is predicted above
// the same devices running one batch each.
#include "deploy/experiment/experiment_checks.h"

#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "deploy/cost/price_table.h"
#include "gtest/gtest.h"

namespace lamina::experiment {
namespace {

// Predicted tokens/s per $/h by topology, from the section's table rows.
std::map<std::string, double> Predicted(const std::string& section) {
  std::map<std::string, double> predicted;
  for (absl::string_view line : absl::StrSplit(section, '\n')) {
    const std::vector<std::string> cells = absl::StrSplit(line, '|');
    double value;
    if (cells.size() < 5 || !absl::SimpleAtod(cells[3], &value)) continue;
    predicted[std::string(absl::StripAsciiWhitespace(cells[2]))] = value;
  }
  return predicted;
}

TEST(PlannerSectionTest, MoreBatchesThanComputeNodesArePredictedPipelined) {
  const std::string dir = std::string(LAMINA_SOURCE_DIR) + "/deploy/";
  absl::StatusOr<PriceTable> prices = LoadPriceTable(dir + "prices/devices.yaml");
  ASSERT_TRUE(prices.ok()) << prices.status();
  ExperimentResult result;
  result.prices = *prices;
  result.spec.context_lengths = {512};
  result.spec.output_tokens = 128;
  result.spec.batch_limits = {256};
  for (const auto& [name, hourly] : std::vector<std::pair<std::string, double>>{
           {"none", 7.4}, {"rotational", 7.4}, {"fixed", 11.1}, {"rotational2", 11.1}}) {
    TopologyInfo info;
    info.entry = {name, dir + "topologies/pipelining-" + name + "-h200.yaml", name == "none"};
    info.cost.hourly_usd = hourly;
    result.topologies.push_back(info);
  }
  absl::StatusOr<std::string> section = PlannerSection(result);
  ASSERT_TRUE(section.ok()) << section.status();
  const std::map<std::string, double> predicted = Predicted(*section);
  ASSERT_EQ(predicted.size(), 4u) << *section;
  // Same devices and price: two batches on one compute GPU above one batch, three batches over
  // two compute GPUs above a batch on each.
  EXPECT_GT(predicted.at("rotational"), predicted.at("none")) << *section;
  EXPECT_GT(predicted.at("rotational2"), predicted.at("fixed")) << *section;
}

}  // namespace
}  // namespace lamina::experiment
