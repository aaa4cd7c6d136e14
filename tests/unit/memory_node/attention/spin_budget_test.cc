// The budget of blocks a memory node's linked steps keep waiting on its GPU, and how a chunk waits
// under it (memory_node/attention/spin_budget.h).
#include "memory_node/attention/spin_budget.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(SpinBudgetTest, TakesOnlyWhatFitsAndGetsItBack) {
  SpinBudget budget(66);
  EXPECT_TRUE(budget.TryTake(40));
  EXPECT_FALSE(budget.TryTake(27)) << "40 + 27 is past 66";
  EXPECT_EQ(budget.taken(), 40);
  EXPECT_TRUE(budget.TryTake(26));
  EXPECT_FALSE(budget.TryTake(1));
  budget.Take(4);  // a wait's fewest blocks go whatever is left
  EXPECT_EQ(budget.taken(), 70);
  budget.Give(70);
  EXPECT_EQ(budget.taken(), 0);
  EXPECT_TRUE(budget.TryTake(66));
}

TEST(SpinBudgetTest, LanesTakingAtOnceNeverPassTheLimit) {
  SpinBudget budget(100);
  std::vector<std::thread> lanes;
  std::vector<int> granted(8, 0);
  for (int t = 0; t < 8; ++t) {
    lanes.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) granted[t] += budget.TryTake(1) ? 1 : 0;
    });
  }
  for (std::thread& lane : lanes) lane.join();
  int total = 0;
  for (int g : granted) total += g;
  EXPECT_EQ(total, 100);
  EXPECT_EQ(budget.taken(), 100);
}

TEST(ChooseChunkWaitTest, ALaunchWithinItsLimitAndTheBudgetPollsForItself) {
  SpinBudget budget(66);
  const ChunkWait wait = ChooseChunkWait(/*waits=*/true, /*lines=*/true, /*rows=*/4, /*launch_blocks=*/64,
                                         /*most_in_launch=*/128, &budget);
  EXPECT_TRUE(wait.in_launch);
  EXPECT_EQ(wait.spinning, 64);
  EXPECT_EQ(budget.taken(), 64);
}

TEST(ChooseChunkWaitTest, ALaunchPastTheBudgetWaitsBehindABlockARow) {
  // Two H200s' case: 4 rows at a short context, 32 (sequence, kv head) pairs in 4 splits, 128
  // blocks, which may poll for themselves but would hold all but 4 SMs.
  SpinBudget budget(66);
  const ChunkWait wait = ChooseChunkWait(true, true, 4, 128, 128, &budget);
  EXPECT_FALSE(wait.in_launch);
  EXPECT_EQ(wait.ahead_blocks, 4);
  EXPECT_EQ(wait.spinning, 4);
  EXPECT_EQ(budget.taken(), 4);
}

TEST(ChooseChunkWaitTest, WithTheBudgetSpentLinesArePolledByAFewBlocks) {
  SpinBudget budget(66);
  ASSERT_TRUE(budget.TryTake(60));
  const ChunkWait wait = ChooseChunkWait(true, true, 32, 16, 128, &budget);
  EXPECT_FALSE(wait.in_launch) << "16 blocks do not fit in the 6 left";
  EXPECT_EQ(wait.ahead_blocks, kFewestPollingBlocks);
  EXPECT_EQ(wait.spinning, kFewestPollingBlocks);
  EXPECT_EQ(budget.taken(), 60 + kFewestPollingBlocks);
}

TEST(ChooseChunkWaitTest, AFlagIsWaitedOnInTheLaunchOnlyForSmallGrids) {
  SpinBudget budget(66);
  const ChunkWait small = ChooseChunkWait(true, /*lines=*/false, 2, 16, /*most_in_launch=*/16, &budget);
  EXPECT_TRUE(small.in_launch);
  EXPECT_EQ(small.spinning, 16);
  const ChunkWait large = ChooseChunkWait(true, false, 8, 64, 16, &budget);
  EXPECT_FALSE(large.in_launch);
  EXPECT_EQ(large.ahead_blocks, 1);
  EXPECT_EQ(large.spinning, 1);
  EXPECT_EQ(budget.taken(), 17);
}

TEST(ChooseChunkWaitTest, RowsAlreadyInPlaceSpinNothing) {
  SpinBudget budget(66);
  const ChunkWait wait = ChooseChunkWait(/*waits=*/false, false, 8, 64, 16, &budget);
  EXPECT_FALSE(wait.in_launch);
  EXPECT_EQ(wait.ahead_blocks, 0);
  EXPECT_EQ(wait.spinning, 0);
  EXPECT_EQ(budget.taken(), 0);
}

}  // namespace
}  // namespace lamina
