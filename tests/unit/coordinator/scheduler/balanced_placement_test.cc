#include "coordinator/scheduler/balanced_placement.h"

#include <limits>

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(BalancedPlacementTest, AMemoryNodeTakesTheRowsItAttendsWithinALayersCompute) {
  // A 32 ms step over 32 layers: 1 ms a layer; 40 us a row at the memory node: 25 rows.
  EXPECT_EQ(BalancedRowCap(0.032, 32, 40e-6), 25);
  // A memory node slower than a layer's compute still takes one row: requests keep moving.
  EXPECT_EQ(BalancedRowCap(0.032, 32, 5e-3), 1);
  // Unknown rates (before the first steps) cap nothing.
  EXPECT_EQ(BalancedRowCap(0, 32, 40e-6), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(BalancedRowCap(0.032, 32, 0), std::numeric_limits<int64_t>::max());
}

}  // namespace
}  // namespace lamina
