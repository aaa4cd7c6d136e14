#include "coordinator/scheduler/balanced_placement.h"

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(BalancedPlacementTest, AMemoryNodeTakesTheRowsItAttendsWithinALayersCompute) {
  // A 32 ms local step over 32 layers: 1 ms a layer; 40 us a row at the memory node: 25 rows.
  EXPECT_EQ(BalancedRowCap(0.032, 32, 40e-6), 25);
  // A memory node slower than a layer's compute still takes one row: requests keep moving.
  EXPECT_EQ(BalancedRowCap(0.032, 32, 5e-3), 1);
  // Unknown rates (before the first steps): one row, which measures them.
  EXPECT_EQ(BalancedRowCap(0, 32, 40e-6), 1);
  EXPECT_EQ(BalancedRowCap(0.032, 32, 0), 1);
}

TEST(DecodePaceTest, OffloadingPaysWhileTheRowsItAddsOutweighTheStepsItSlows) {
  DecodePace pace;
  EXPECT_TRUE(pace.OffloadingPays()) << "unmeasured: the probe row goes";
  pace.Record(16, 1, 0.012);  // a mixed step before any local one says nothing yet
  EXPECT_EQ(pace.gain(), 0);
  pace.Record(16, 0, 0.008);
  pace.Record(16, 0, 0.006);
  EXPECT_DOUBLE_EQ(pace.local_step_seconds(), 0.007);
  // 20 rows in 8 ms against 16 in 7 ms: 1.09 (pays).
  pace.Record(16, 4, 0.008);
  EXPECT_DOUBLE_EQ(pace.gain(), 1.09375);
  EXPECT_TRUE(pace.OffloadingPays());
  // 17 rows in 21 ms: 17/21 ÷ 16/7 = 0.354; blended with 1.09: 0.72.
  pace.Record(16, 1, 0.021);
  EXPECT_NEAR(pace.gain(), 0.5 * (1.09375 + (17.0 / 0.021) / (16.0 / 0.007)), 1e-12);
  EXPECT_FALSE(pace.OffloadingPays());
  // Steps with no local row say nothing about the trade.
  pace.Record(0, 8, 0.1);
  EXPECT_NEAR(pace.gain(), 0.5 * (1.09375 + (17.0 / 0.021) / (16.0 / 0.007)), 1e-12);
}

}  // namespace
}  // namespace lamina
