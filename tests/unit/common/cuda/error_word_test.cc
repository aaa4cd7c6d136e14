// cuda::ErrorWord on one GPU: Take reads a code a wait set and clears it, and Abort sets the word
// while a wait spins on it (its copy runs beside the spinning kernel), ending that wait within
// moments rather than at its timeout. Skips without a GPU.
#include "common/cuda/error_word.h"

#include <cstdint>
#include <vector>

#include "absl/time/clock.h"
#include "common/cuda/device_buffer.h"
#include "gtest/gtest.h"
#include "kernels/cuda/data_plane.h"
#include "tests/support/cuda_test_util.h"

namespace lamina::cuda {
namespace {

using ::lamina::testing::DataPlaneGpuTest;
using ::lamina::testing::Upload;

using ErrorWordTest = DataPlaneGpuTest;

TEST_F(ErrorWordTest, TakeReadsWhatAWaitThatGaveUpSetAndClearsIt) {
  auto word = ErrorWord::Create();
  ASSERT_TRUE(word.ok()) << word.status();
  auto stream = Stream::Create();
  ASSERT_TRUE(stream.ok());
  auto flag = Upload(std::vector<uint64_t>{0});
  EXPECT_EQ(*word->Take(), 0u) << "a new word is clear";
  // A flag that never rises: the wait gives up after 1 ms and sets code 3.
  ASSERT_TRUE(kernels::cuda::WaitFlag(flag.as<uint64_t>(), 1, 1'000'000, word->get(), 3, stream->get()).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(*word->Take(), 3u);
  EXPECT_EQ(*word->Take(), 0u) << "Take clears the word";
}

TEST_F(ErrorWordTest, AbortEndsAWaitSpinningOnTheWord) {
  auto word = ErrorWord::Create();
  ASSERT_TRUE(word.ok()) << word.status();
  auto stream = Stream::Create();
  ASSERT_TRUE(stream.ok());
  auto flag = Upload(std::vector<uint64_t>{0});
  ASSERT_TRUE(kernels::cuda::WaitFlag(flag.as<uint64_t>(), 1, 10'000'000'000, word->get(), 3, stream->get()).ok());
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_EQ(cudaStreamQuery(stream->get()), cudaErrorNotReady) << "the wait must still be spinning";
  const absl::Time aborted = absl::Now();
  ASSERT_TRUE(word->Abort(7).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_LT(absl::Now() - aborted, absl::Seconds(1)) << "the wait had 10 s left";
  EXPECT_EQ(*word->Take(), 7u) << "the abort's code, not the wait's";
}

}  // namespace
}  // namespace lamina::cuda
