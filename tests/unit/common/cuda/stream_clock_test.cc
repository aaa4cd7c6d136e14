// StreamClock on one GPU: stretches of known length queued on a stream (WaitFlag on a flag that
// never rises spins for exactly its timeout), marked computing or not, come back as intervals of
// those lengths on the host clock, ending when the host saw the stream done. Skips without a GPU.
#include "common/cuda/stream_clock.h"

#include <cstdint>

#include "common/cuda/device_buffer.h"
#include "gtest/gtest.h"
#include "kernels/cuda/data_plane.h"
#include "tests/support/cuda_test_util.h"

namespace lamina::cuda {
namespace {

class StreamClockTest : public ::lamina::testing::DataPlaneGpuTest {
 protected:
  void SetUp() override {
    DataPlaneGpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto stream = Stream::Create();
    ASSERT_TRUE(stream.ok());
    stream_ = *std::move(stream);
    auto words = DeviceBuffer::Create(2 * sizeof(uint64_t));
    ASSERT_TRUE(words.ok());
    words_ = *std::move(words);
    ASSERT_EQ(cudaMemset(words_.data(), 0, words_.bytes()), cudaSuccess);
  }

  // Queues a stretch of the stream's time: a wait that gives up after `ms`.
  void Spin(int64_t ms) {
    ASSERT_EQ(cudaMemsetAsync(words_.as<uint8_t>() + sizeof(uint64_t), 0, sizeof(uint32_t), stream_.get()),
              cudaSuccess);
    ASSERT_TRUE(kernels::cuda::WaitFlag(words_.as<uint64_t>(), 1, ms * 1'000'000,
                                        reinterpret_cast<uint32_t*>(words_.as<uint64_t>() + 1), 1, stream_.get())
                    .ok());
  }

  Stream stream_;
  DeviceBuffer words_;  // uint64 flag (never raised), uint32 error word
};

TEST_F(StreamClockTest, ComputingStretchesComeBackWithTheirLengthsAndExchangesAreLeftOut) {
  auto made = StreamClock::Create(4);
  ASSERT_TRUE(made.ok()) << made.status();
  StreamClock clock = *std::move(made);
  ASSERT_TRUE(clock.Mark(true, stream_.get()).ok());
  Spin(30);                                            // computing
  ASSERT_TRUE(clock.Mark(false, stream_.get()).ok());  // an exchange
  Spin(50);
  ASSERT_TRUE(clock.Mark(true, stream_.get()).ok());
  ASSERT_TRUE(clock.Mark(true, stream_.get()).ok());   // no change: left out
  Spin(20);
  ASSERT_TRUE(clock.Mark(false, stream_.get()).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
  const absl::Time done = absl::Now();

  auto intervals = clock.Take(done);
  ASSERT_TRUE(intervals.ok()) << intervals.status();
  ASSERT_EQ(intervals->size(), 2u);
  const auto& [first_begin, first_end] = (*intervals)[0];
  const auto& [second_begin, second_end] = (*intervals)[1];
  // Spins last their timeout and a little more (a launch, a memset); never less.
  EXPECT_GE(first_end - first_begin, absl::Milliseconds(30));
  EXPECT_LT(first_end - first_begin, absl::Milliseconds(36));
  EXPECT_GE(second_end - second_begin, absl::Milliseconds(20));
  EXPECT_LT(second_end - second_begin, absl::Milliseconds(26));
  EXPECT_GE(second_begin - first_end, absl::Milliseconds(50)) << "the exchange between them";
  EXPECT_LT(second_begin - first_end, absl::Milliseconds(56));
  EXPECT_EQ(second_end, done) << "the last mark is placed where the host saw the stream done";

  auto again = clock.Take(absl::Now());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty()) << "Take clears the marks";
}

TEST_F(StreamClockTest, AStretchStillComputingCannotBeTakenAndClearForgetsIt) {
  auto made = StreamClock::Create(2);
  ASSERT_TRUE(made.ok()) << made.status();
  StreamClock clock = *std::move(made);
  ASSERT_TRUE(clock.Mark(true, stream_.get()).ok());
  Spin(1);
  ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
  auto open = clock.Take(absl::Now());
  EXPECT_EQ(open.status().code(), absl::StatusCode::kFailedPrecondition) << open.status();

  ASSERT_TRUE(clock.Mark(true, stream_.get()).ok());
  clock.Clear();  // abandoned
  ASSERT_TRUE(clock.Mark(true, stream_.get()).ok());
  Spin(5);
  ASSERT_TRUE(clock.Mark(false, stream_.get()).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
  auto taken = clock.Take(absl::Now());
  ASSERT_TRUE(taken.ok()) << taken.status();
  ASSERT_EQ(taken->size(), 1u);
  EXPECT_GE((*taken)[0].second - (*taken)[0].first, absl::Milliseconds(5));
  EXPECT_LT((*taken)[0].second - (*taken)[0].first, absl::Milliseconds(11));
}

TEST_F(StreamClockTest, MarksBeyondTheRoomMadeDropTheStretchesInsteadOfMakingEvents) {
  auto made = StreamClock::Create(2);
  ASSERT_TRUE(made.ok()) << made.status();
  StreamClock clock = *std::move(made);
  for (bool computing : {true, false, true, false}) ASSERT_TRUE(clock.Mark(computing, stream_.get()).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
  auto dropped = clock.Take(absl::Now());
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_TRUE(dropped->empty());
  // The next stretch fits again.
  for (bool computing : {true, false}) ASSERT_TRUE(clock.Mark(computing, stream_.get()).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
  auto taken = clock.Take(absl::Now());
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->size(), 1u);
}

}  // namespace
}  // namespace lamina::cuda
