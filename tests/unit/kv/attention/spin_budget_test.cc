// The budget of blocks a memory node's linked steps keep waiting on its GPU, and how a chunk waits
// under it (kv/attention/spin_budget.h).
#include "kv/attention/spin_budget.h"

#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lamina {
namespace {

// The budget of a GPU of 132 SMs (an H100 or H200) with `lanes` lanes.
std::unique_ptr<SpinBudget> BudgetOf132Sms(int lanes) {
  std::unique_ptr<SpinBudget> budget = SpinBudget::ForSms(132);
  for (int i = 0; i < lanes; ++i) budget->AddLane();
  return budget;
}

TEST(SpinBudgetTest, TakesOnlyWhatFitsAndGetsItBack) {
  SpinBudget budget(66, 128);
  budget.AddLane();
  budget.AddLane();
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
  SpinBudget budget(100, 200);
  for (int t = 0; t < 8; ++t) budget.AddLane();
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

TEST(SpinBudgetTest, ALoneLaneTakesAllButAFewSmsAndASecondLaneHalvesTheLimit) {
  std::unique_ptr<SpinBudget> budget = BudgetOf132Sms(1);
  EXPECT_EQ(budget->limit(), 132 - kSmsLeftByALoneLane);
  EXPECT_TRUE(budget->TryTake(128));
  const int second = budget->AddLane();
  EXPECT_EQ(budget->limit(), 66);
  EXPECT_FALSE(budget->TryTake(1)) << "the lone lane's 128 are past the shared limit";
  budget->Give(128);
  EXPECT_TRUE(budget->TryTake(66));
  EXPECT_FALSE(budget->TryTake(1));
  budget->RemoveLane(second);
  EXPECT_TRUE(budget->TryTake(62)) << "alone again";
  EXPECT_FALSE(budget->TryTake(1));
}

TEST(SpinBudgetTest, ALoneLaneCountsSmallBlocksByTheSmsTheyFillOverTwoWaves) {
  std::unique_ptr<SpinBudget> budget = BudgetOf132Sms(1);
  EXPECT_EQ(budget->CountOf(1024, 4), 128) << "1024 blocks, 4 an SM, in two waves";
  EXPECT_EQ(budget->CountOf(1025, 4), 129);
  EXPECT_EQ(budget->CountOf(7, 4), 1);
  EXPECT_EQ(budget->CountOf(100, 1), 100) << "a block an SM counts whole";
  budget->AddLane();
  EXPECT_EQ(budget->CountOf(1024, 4), 1024) << "with several lanes every block counts";
}

TEST(ChooseChunkWaitTest, ALoneLanesLaunchOfSmallBlocksPollsForItselfUpToTwoWaves) {
  // 128 rows of Llama-3-8B's shape a warp per query head: 1024 blocks, 4 an SM.
  std::unique_ptr<SpinBudget> budget = BudgetOf132Sms(1);
  const ChunkWait wait = ChooseChunkWait(true, /*lines=*/false, 128, 1024, /*most_in_launch=*/128, budget.get(),
                                         /*launch_blocks_an_sm=*/4);
  EXPECT_TRUE(wait.in_launch);
  EXPECT_EQ(wait.spinning, 128);
  EXPECT_EQ(budget->taken(), 128);
  budget->Give(128);
  const ChunkWait past = ChooseChunkWait(true, false, 130, 1040, 128, budget.get(), 4);
  EXPECT_FALSE(past.in_launch) << "130 SMs' worth is past the lone lane's 128";
  EXPECT_EQ(past.ahead_blocks, 1);
}

TEST(ChooseChunkWaitTest, SeveralLanesCountSmallBlocksWhole) {
  std::unique_ptr<SpinBudget> budget = BudgetOf132Sms(2);
  const ChunkWait wait = ChooseChunkWait(true, false, 16, 128, 128, budget.get(), 4);
  EXPECT_FALSE(wait.in_launch) << "128 blocks are past the shared 66";
  const ChunkWait small = ChooseChunkWait(true, false, 8, 64, 128, budget.get(), 4);
  EXPECT_TRUE(small.in_launch);
  EXPECT_EQ(small.spinning, 64);
}

// Llama-3-8B's shape a warp per query head, its blocks of 1, 2 and 4 pairs held 4, 2 and 1 an SM.
int64_t QueryHeadBlocksAnSm(int width) { return width == 1 ? 4 : width == 2 ? 2 : 1; }

TEST(SpinBudgetTest, AStepSharesTheLimitAmongTheLanesStepping) {
  std::unique_ptr<SpinBudget> budget = SpinBudget::ForSms(132);
  const int a = budget->AddLane(), b = budget->AddLane(), idle = budget->AddLane();
  EXPECT_EQ(budget->BeginStep(a), 66) << "no other lane has stepped since a was added";
  EXPECT_EQ(budget->BeginStep(b), 33) << "a's step is open";
  budget->EndStep(a);
  budget->EndStep(b);
  EXPECT_EQ(budget->BeginStep(a), 33) << "b began a step since a's last";
  budget->EndStep(a);
  EXPECT_EQ(budget->BeginStep(b), 33) << "a began one since b's last";
  budget->EndStep(b);
  // b idles from here: a steps alone from its second step on, and idle never counted.
  EXPECT_EQ(budget->BeginStep(a), 33) << "b's step began since a's last";
  budget->EndStep(a);
  EXPECT_EQ(budget->BeginStep(a), 66);
  budget->EndStep(a);
  EXPECT_EQ(budget->BeginStep(idle), 66 / 3) << "a and b stepped since idle was added";
  EXPECT_EQ(budget->BeginStep(b), 66 / 3) << "a began since b's last, idle's step is open";
  budget->RemoveLane(idle);
  budget->EndStep(b);
  EXPECT_EQ(budget->BeginStep(a), 33) << "b began since a's last; idle is gone";
}

TEST(FewestPairsPerBlockTest, SeveralLanesTakeTheFewestPairsABlockThatFitTheirShareElseWhatIsLeft) {
  std::unique_ptr<SpinBudget> budget = BudgetOf132Sms(2);
  EXPECT_EQ(FewestPairsPerBlock(4 * 8, 128, 33, *budget, QueryHeadBlocksAnSm), 1) << "4 rows: 32 blocks fit 33";
  EXPECT_EQ(FewestPairsPerBlock(8 * 8, 128, 33, *budget, QueryHeadBlocksAnSm), 2) << "8 rows: 32 blocks of 2";
  EXPECT_EQ(FewestPairsPerBlock(16 * 8, 128, 33, *budget, QueryHeadBlocksAnSm), 4) << "16 rows: 32 blocks of 4";
  EXPECT_EQ(FewestPairsPerBlock(32 * 8, 128, 33, *budget, QueryHeadBlocksAnSm), 4)
      << "32 rows: past the share at any width, 64 blocks of 4 fit what is left";
  EXPECT_EQ(FewestPairsPerBlock(64 * 8, 128, 33, *budget, QueryHeadBlocksAnSm), 1) << "64 rows fit no width: 1";
  // Two lanes stepping at once both fit at 16 rows, whichever queues first.
  ASSERT_TRUE(budget->TryTake(32));
  EXPECT_EQ(FewestPairsPerBlock(16 * 8, 128, 33, *budget, QueryHeadBlocksAnSm), 4) << "32 blocks of 4 in the 34 left";
  budget->Give(32);
  ASSERT_TRUE(budget->TryTake(40));
  EXPECT_EQ(FewestPairsPerBlock(8 * 8, 128, 33, *budget, QueryHeadBlocksAnSm), 4) << "26 left: 16 blocks of 4";
  EXPECT_EQ(FewestPairsPerBlock(16 * 8, 128, 33, *budget, QueryHeadBlocksAnSm), 1) << "32 blocks of 4 past 26";
  EXPECT_EQ(FewestPairsPerBlock(8 * 8, 15, 33, *budget, QueryHeadBlocksAnSm), 1) << "past the launch's own limit";
}

TEST(FewestPairsPerBlockTest, ALoneLaneKeepsAPairABlockWhileItsBlocksFit) {
  std::unique_ptr<SpinBudget> budget = BudgetOf132Sms(1);
  EXPECT_EQ(FewestPairsPerBlock(128 * 8, 128, 128, *budget, QueryHeadBlocksAnSm), 1) << "1024 blocks: 128 SMs' worth";
  EXPECT_EQ(FewestPairsPerBlock(3, 128, 128, *budget, QueryHeadBlocksAnSm), 1);
}

TEST(ChooseChunkWaitTest, ALaunchWithinItsLimitAndTheBudgetPollsForItself) {
  std::unique_ptr<SpinBudget> budget = BudgetOf132Sms(2);
  const ChunkWait wait = ChooseChunkWait(/*waits=*/true, /*lines=*/true, /*rows=*/4, /*launch_blocks=*/64,
                                         /*most_in_launch=*/128, budget.get());
  EXPECT_TRUE(wait.in_launch);
  EXPECT_EQ(wait.spinning, 64);
  EXPECT_EQ(budget->taken(), 64);
}

TEST(ChooseChunkWaitTest, ALoneLanesLaunchOfAllButAFewSmsPollsForItself) {
  // Batch 1 at context 1024: 8 kv heads in 16 splits.
  std::unique_ptr<SpinBudget> budget = BudgetOf132Sms(1);
  const ChunkWait wait = ChooseChunkWait(true, true, 1, 128, 128, budget.get());
  EXPECT_TRUE(wait.in_launch);
  EXPECT_EQ(budget->taken(), 128);
}

TEST(ChooseChunkWaitTest, ALaunchPastTheBudgetWaitsBehindABlockARow) {
  // Two H200s' case, a rotating cluster's lanes: 4 rows at a short context, 32 (sequence, kv
  // head) pairs in 4 splits, 128 blocks, which may poll for themselves but would hold all but 4
  // SMs.
  std::unique_ptr<SpinBudget> budget = BudgetOf132Sms(2);
  const ChunkWait wait = ChooseChunkWait(true, true, 4, 128, 128, budget.get());
  EXPECT_FALSE(wait.in_launch);
  EXPECT_EQ(wait.ahead_blocks, 4);
  EXPECT_EQ(wait.spinning, 4);
  EXPECT_EQ(budget->taken(), 4);
}

TEST(ChooseChunkWaitTest, WithTheBudgetSpentLinesArePolledByAFewBlocks) {
  std::unique_ptr<SpinBudget> budget = BudgetOf132Sms(2);
  ASSERT_TRUE(budget->TryTake(60));
  const ChunkWait wait = ChooseChunkWait(true, true, 32, 16, 128, budget.get());
  EXPECT_FALSE(wait.in_launch) << "16 blocks do not fit in the 6 left";
  EXPECT_EQ(wait.ahead_blocks, kFewestPollingBlocks);
  EXPECT_EQ(wait.spinning, kFewestPollingBlocks);
  EXPECT_EQ(budget->taken(), 60 + kFewestPollingBlocks);
}

TEST(ChooseChunkWaitTest, AFlagIsWaitedOnInTheLaunchOnlyForSmallGrids) {
  std::unique_ptr<SpinBudget> budget = BudgetOf132Sms(2);
  const ChunkWait small = ChooseChunkWait(true, /*lines=*/false, 2, 16, /*most_in_launch=*/16, budget.get());
  EXPECT_TRUE(small.in_launch);
  EXPECT_EQ(small.spinning, 16);
  const ChunkWait large = ChooseChunkWait(true, false, 8, 64, 16, budget.get());
  EXPECT_FALSE(large.in_launch);
  EXPECT_EQ(large.ahead_blocks, 1);
  EXPECT_EQ(large.spinning, 1);
  EXPECT_EQ(budget->taken(), 17);
}

TEST(ChooseChunkWaitTest, RowsAlreadyInPlaceSpinNothing) {
  std::unique_ptr<SpinBudget> budget = BudgetOf132Sms(2);
  const ChunkWait wait = ChooseChunkWait(/*waits=*/false, false, 8, 64, 16, budget.get());
  EXPECT_FALSE(wait.in_launch);
  EXPECT_EQ(wait.ahead_blocks, 0);
  EXPECT_EQ(wait.spinning, 0);
  EXPECT_EQ(budget->taken(), 0);
}

}  // namespace
}  // namespace lamina
