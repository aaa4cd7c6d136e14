#include "common/metrics/interval_union.h"

#include "gtest/gtest.h"

namespace lamina {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

absl::Time At(int64_t ms) { return kT0 + absl::Milliseconds(ms); }

TEST(IntervalUnionTest, DisjointIntervalsAddUp) {
  IntervalUnion busy;
  busy.Add(At(0), At(10));
  busy.Add(At(20), At(25));
  const BusyMeter::Snapshot s = busy.Read();
  EXPECT_DOUBLE_EQ(s.busy_seconds, 0.015);
  EXPECT_EQ(s.count, 2);
}

TEST(IntervalUnionTest, OverlapsFromSeveralLanesCountOnceInAnyOrder) {
  IntervalUnion busy;
  busy.Add(At(50), At(60));  // a later pass reported first
  busy.Add(At(0), At(10));
  busy.Add(At(5), At(20));   // overlaps the first
  busy.Add(At(20), At(30));  // touches it
  busy.Add(At(40), At(70));  // covers [50, 60)
  busy.Add(At(12), At(14));  // inside
  EXPECT_DOUBLE_EQ(busy.Read().busy_seconds, 0.030 + 0.030);
}

TEST(IntervalUnionTest, EmptyAndReversedIntervalsAreIgnored) {
  IntervalUnion busy;
  busy.Add(At(10), At(10));
  busy.Add(At(10), At(5));
  EXPECT_DOUBLE_EQ(busy.Read().busy_seconds, 0);
}

TEST(IntervalUnionTest, SettledTimeStaysCountedAndALateOverlapIsNotCountedTwice) {
  IntervalUnion busy(absl::Milliseconds(100));
  busy.Add(At(0), At(50));
  busy.Add(At(200), At(210));  // settles everything before 110
  EXPECT_DOUBLE_EQ(busy.Read().busy_seconds, 0.060);
  busy.Add(At(40), At(120));   // arrives late: only [110, 120) is new
  EXPECT_DOUBLE_EQ(busy.Read().busy_seconds, 0.070);
  busy.Add(At(115), At(205));  // merges [110, 120) and [200, 210): adds [120, 200)
  EXPECT_DOUBLE_EQ(busy.Read().busy_seconds, 0.150);
}

TEST(IntervalUnionTest, AnIntervalAcrossTheSettledBoundaryIsSplitNotLost) {
  IntervalUnion busy(absl::Milliseconds(100));
  busy.Add(At(0), At(300));
  busy.Add(At(350), At(360));  // the boundary, 260, falls inside the first
  EXPECT_DOUBLE_EQ(busy.Read().busy_seconds, 0.310);
  busy.Add(At(250), At(355));  // [250, 260) is settled already; it fills [300, 350)
  EXPECT_DOUBLE_EQ(busy.Read().busy_seconds, 0.360);
}

}  // namespace
}  // namespace lamina
