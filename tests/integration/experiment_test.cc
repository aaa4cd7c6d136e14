// `lamina experiment` end to end on the CPU: a colocated and an offloaded topology of the demo
// model, real clusters started and stopped by the command, and a report whose numbers agree with
// each other: CSV, Markdown, plots and fitted costs.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "deploy/simulator/cost_model.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace lamina {
namespace {

int RunCommand(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output->append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ExperimentTest, CpuExperimentWritesAConsistentReport) {
  testing::TempDir dir;
  const std::string spec = dir.Write("spec.yaml", R"(name: ci
prices: )" LAMINA_SOURCE_DIR R"(/deploy/prices/devices.yaml
topologies:
  - name: colocated
    file: )" LAMINA_SOURCE_DIR R"(/deploy/topologies/colocated-cpu.yaml
    baseline: true
  - name: offloaded
    file: )" LAMINA_SOURCE_DIR R"(/deploy/topologies/offloaded-cpu.yaml
batch_limits: [2, 4]
context_lengths: [40, 80]
output_tokens: 8
requests_per_batch: 2
min_requests: 4
)");
  const std::string out = dir.path() + "/report";
  std::string log;
  ASSERT_EQ(RunCommand(std::string(LAMINA_BINARY) + " experiment " + spec + " --out " + out + " --quiet", &log), 0) << log;
  EXPECT_NE(log.find("8 runs (0 failed)"), std::string::npos) << log;

  // Every run succeeded, and tokens/s per $/h is tokens/s over the topology's price.
  std::istringstream csv(testing::ReadFileOrDie(out + "/results.csv"));
  std::string line;
  std::getline(csv, line);
  std::vector<std::string> header = absl::StrSplit(line, ',');
  std::map<std::string, size_t> column;
  for (size_t i = 0; i < header.size(); ++i) column[header[i]] = i;
  const std::map<std::string, double> price = {{"colocated", 0.70}, {"offloaded", 0.70 + 2 * 0.20}};
  std::map<std::pair<std::string, std::string>, double> best;  // (topology, context) -> best tok/s per $/h
  int rows = 0;
  while (std::getline(csv, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ',');
    ASSERT_EQ(f.size(), header.size()) << line;
    ++rows;
    const std::string topology = f[column["topology"]];
    EXPECT_EQ(f[column["failed"]], "0") << line;
    EXPECT_EQ(f[column["error"]], "") << line;
    const double tokens = std::stod(f[column["output_tokens_per_s"]]);
    const double hourly = std::stod(f[column["hourly_usd"]]);
    const double per_dollar = std::stod(f[column["tokens_per_s_per_usd_hour"]]);
    EXPECT_GT(tokens, 0) << line;
    EXPECT_NEAR(hourly, price.at(topology), 1e-9) << line;
    EXPECT_NEAR(per_dollar, tokens / hourly, 1e-3 * per_dollar) << line;
    EXPECT_GT(std::stod(f[column["compute_busy"]]), 0) << line;
    EXPECT_GT(std::stod(f[column["mean_batch"]]), 0) << line;
    double& b = best[{topology, f[column["context"]]}];
    b = std::max(b, per_dollar);
  }
  EXPECT_EQ(rows, 8);

  // The report's best-per-dollar table holds the CSV's best values.
  const std::string report = testing::ReadFileOrDie(out + "/report.md");
  for (const auto& [key, value] : best) {
    char cell[64];
    std::snprintf(cell, sizeof(cell), "| %s | %s | ", key.second.c_str(), key.first.c_str());
    const size_t at = report.find(cell, report.find("## Throughput per dollar"));
    ASSERT_NE(at, std::string::npos) << cell;
    // The row is "| context | topology | best batch limit | tok/s per $/h | vs baseline |". The report
    // rounds the full value to one decimal and the CSV to four, so they agree to 0.05 plus the CSV's rounding.
    const std::string row = report.substr(at, report.find('\n', at) - at);
    std::vector<std::string> cells = absl::StrSplit(row, '|');
    ASSERT_GE(cells.size(), 5u) << row;
    double shown = 0;
    ASSERT_TRUE(absl::SimpleAtod(cells[4], &shown)) << row;
    EXPECT_NEAR(shown, value, 0.05 + 1e-4) << row;
  }
  EXPECT_NE(report.find("## Planner check"), std::string::npos);
  EXPECT_NE(report.find("## Simulator check"), std::string::npos);
  EXPECT_NE(report.find("Mean absolute error over 8 runs"), std::string::npos);

  // Plots: per context, one line per topology with a point per batch limit; per dollar, one line
  // per topology with a point per context.
  for (const char* name : {"throughput_vs_batch_ctx40.svg", "throughput_vs_batch_ctx80.svg", "per_dollar_vs_context.svg"}) {
    const std::string svg = testing::ReadFileOrDie(out + "/" + name);
    EXPECT_EQ(Count(svg, "class=\"series\""), 2) << name;
    EXPECT_EQ(Count(svg, "<circle"), 4) << name;
  }
  // The fitted costs load back for `lamina simulate`.
  absl::StatusOr<simulator::CostModel> costs = simulator::LoadCostModel(out + "/costs-offloaded.yaml");
  ASSERT_TRUE(costs.ok()) << costs.status();
  EXPECT_EQ(costs->memory_nodes, 2);
  EXPECT_EQ(costs->kv_capacity_tokens, 8192);
}

TEST(ExperimentTest, BadSpecNamesTheField) {
  testing::TempDir dir;
  const std::string spec = dir.Write("spec.yaml", "topologies: []\nbatch_limits: [4]\ncontext_lengths: [8]\noutput_tokens: 16\n");
  std::string log;
  EXPECT_EQ(RunCommand(std::string(LAMINA_BINARY) + " experiment " + spec, &log), 2);
  EXPECT_NE(log.find("spec.yaml:3: context_lengths[0]: must exceed output_tokens"), std::string::npos) << log;
}

}  // namespace
}  // namespace lamina
