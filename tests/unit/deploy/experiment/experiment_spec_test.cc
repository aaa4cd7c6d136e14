// The experiment specs shipped in deploy/experiments: each loads, and names topologies that load.
#include "deploy/experiment/experiment_spec.h"

#include <filesystem>

#include "common/topology/topology.h"
#include "gtest/gtest.h"

namespace lamina::experiment {
namespace {

TEST(ExperimentSpecTest, EveryBundledSpecLoadsWithItsTopologies) {
  int loaded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(LAMINA_SOURCE_DIR) + "/deploy/experiments")) {
    if (entry.path().extension() != ".yaml") continue;
    absl::StatusOr<ExperimentSpec> spec = LoadExperimentSpec(entry.path().string());
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_FALSE(spec->topologies.empty()) << entry.path();
    int baselines = 0;
    for (const TopologyEntry& t : spec->topologies) {
      absl::StatusOr<Topology> topology = LoadTopology(t.file);
      EXPECT_TRUE(topology.ok()) << entry.path() << ", topology " << t.name << ": " << topology.status();
      baselines += t.baseline ? 1 : 0;
    }
    EXPECT_EQ(baselines, 1) << entry.path();
    ++loaded;
  }
  EXPECT_GT(loaded, 5);
}

}  // namespace
}  // namespace lamina::experiment
