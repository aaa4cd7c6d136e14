// StepStagger: the hold before a batch's step is the offset (decode step time / layers / batches)
// after the latest step of another batch, never negative, and nothing with one batch or before a
// decode step was timed.
#include "coordinator/scheduler/step_stagger.h"

#include "gtest/gtest.h"

namespace lamina {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(StepStaggerTest, HoldsUntilTheOffsetAfterAnotherBatchsStep) {
  StepStagger stagger(/*batches=*/2, /*layers=*/32);
  stagger.DecodeStepTook(absl::Milliseconds(64));
  EXPECT_EQ(stagger.offset(), absl::Milliseconds(1));  // 64 ms / 32 layers / 2 batches
  stagger.Sent(0, kStart);
  EXPECT_EQ(stagger.Hold(1, kStart), absl::Milliseconds(1));
  EXPECT_EQ(stagger.Hold(1, kStart + absl::Microseconds(300)), absl::Microseconds(700));
  EXPECT_EQ(stagger.Hold(1, kStart + absl::Milliseconds(5)), absl::ZeroDuration()) << "long past: no hold";
  EXPECT_EQ(stagger.Hold(0, kStart), absl::ZeroDuration()) << "a batch does not wait for its own step";
  stagger.Sent(1, kStart + absl::Milliseconds(1));
  EXPECT_EQ(stagger.Hold(0, kStart + absl::Milliseconds(1)), absl::Milliseconds(1));
}

TEST(StepStaggerTest, TheLatestOtherBatchCounts) {
  StepStagger stagger(/*batches=*/3, /*layers=*/10);
  stagger.DecodeStepTook(absl::Milliseconds(30));  // offset 1 ms
  stagger.Sent(0, kStart);
  stagger.Sent(1, kStart + absl::Microseconds(600));
  EXPECT_EQ(stagger.Hold(2, kStart + absl::Microseconds(600)), absl::Milliseconds(1));
  EXPECT_EQ(stagger.Hold(0, kStart + absl::Microseconds(600)), absl::Milliseconds(1));
}

TEST(StepStaggerTest, NothingWithOneBatchOrBeforeADecodeStepWasTimed) {
  StepStagger one(/*batches=*/1, /*layers=*/32);
  one.DecodeStepTook(absl::Milliseconds(64));
  one.Sent(0, kStart);
  EXPECT_EQ(one.Hold(0, kStart), absl::ZeroDuration());

  StepStagger untimed(/*batches=*/2, /*layers=*/32);
  untimed.Sent(0, kStart);
  EXPECT_EQ(untimed.Hold(1, kStart), absl::ZeroDuration());
  untimed.DecodeStepTook(absl::ZeroDuration());
  EXPECT_EQ(untimed.Hold(1, kStart), absl::ZeroDuration()) << "a step of no length is not a measurement";
}

TEST(StepStaggerTest, TheStepTimeIsARunningMean) {
  StepStagger stagger(/*batches=*/2, /*layers=*/1);
  stagger.DecodeStepTook(absl::Milliseconds(10));
  EXPECT_EQ(stagger.offset(), absl::Milliseconds(5));
  stagger.DecodeStepTook(absl::Milliseconds(20));  // 0.8 x 10 + 0.2 x 20 = 12 ms
  EXPECT_EQ(stagger.offset(), absl::Milliseconds(6));
}

}  // namespace
}  // namespace lamina
