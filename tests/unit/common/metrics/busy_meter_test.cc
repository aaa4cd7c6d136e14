#include "common/metrics/busy_meter.h"

#include <thread>

#include "gtest/gtest.h"

namespace lamina {
namespace {

// Bounds are one-sided where the scheduler can only add time: each check fails if overlapping
// or paused stretches were counted (which would at least double the figure).

TEST(BusyMeterTest, SumsWhatIsAddedAndCountsIt) {
  BusyMeter meter;
  meter.Add(absl::Milliseconds(30));
  meter.Add(absl::Milliseconds(20));
  const BusyMeter::Snapshot s = meter.Read();
  EXPECT_DOUBLE_EQ(s.busy_seconds, 0.05);
  EXPECT_EQ(s.count, 2);
}

TEST(BusyUnionTest, OverlappingActivitiesCountOnce) {
  BusyUnion meter;
  meter.Enter();
  meter.Enter();  // a second lane starts while the first runs
  absl::SleepFor(absl::Milliseconds(60));
  meter.Leave();
  meter.Leave();
  const double busy = meter.Read().busy_seconds;
  EXPECT_GE(busy, 0.06);
  EXPECT_LT(busy, 0.118) << "counted twice";
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_DOUBLE_EQ(meter.Read().busy_seconds, busy) << "idle time is not busy";
}

TEST(BusyUnionTest, APauseIsLeftOutAndAnOpenStretchIsCountedSoFar) {
  BusyUnion meter;
  {
    ScopedActive active(&meter);
    absl::SleepFor(absl::Milliseconds(30));
    {
      ScopedPause waiting(&meter);  // waiting on a memory node
      absl::SleepFor(absl::Milliseconds(90));
    }
    absl::SleepFor(absl::Milliseconds(30));
    EXPECT_GE(meter.Read().busy_seconds, 0.06);  // still active: counted up to now
  }
  const BusyMeter::Snapshot s = meter.Read();
  EXPECT_GE(s.busy_seconds, 0.06);
  EXPECT_LT(s.busy_seconds, 0.15) << "the pause was counted";
  EXPECT_GE(s.clock_seconds, 0.15);
}

}  // namespace
}  // namespace lamina
