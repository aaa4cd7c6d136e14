// QueuePacer on one GPU: behind a wait that holds the stream, a thread queuing thousands of
// launches through the pacer stops at the bound, so the stream's queue never fills and another
// thread's CUDA calls (cudaMallocHost, which a launch blocked on a full queue holds back) return at
// once; once the wait ends, every unit runs. Skips without a GPU.
#include "common/cuda/queue_pacer.h"

#include <atomic>
#include <cstdint>
#include <thread>

#include "absl/time/clock.h"
#include "common/cuda/device_buffer.h"
#include "gtest/gtest.h"
#include "kernels/cuda/data_plane.h"
#include "tests/support/cuda_test_util.h"

namespace lamina::cuda {
namespace {

class QueuePacerTest : public ::lamina::testing::DataPlaneGpuTest {};

TEST_F(QueuePacerTest, AThreadBehindAWaitStopsAtTheBoundAndOtherThreadsCallsDoNotBlock) {
  auto stream = Stream::Create();
  ASSERT_TRUE(stream.ok());
  auto words = DeviceBuffer::CreateZeroed(3 * sizeof(uint64_t));  // a flag never raised, one at 0, error
  ASSERT_TRUE(words.ok());
  const uint64_t* never = words->as<uint64_t>();
  const uint64_t* passed = words->as<uint64_t>() + 1;
  uint32_t* error = reinterpret_cast<uint32_t*>(words->as<uint64_t>() + 2);
  auto pacer = QueuePacer::Create(64);
  ASSERT_TRUE(pacer.ok()) << pacer.status();

  // The wait holds the stream for 1.5 s (it gives up then, setting the error word).
  constexpr int64_t kHoldMs = 1500;
  ASSERT_TRUE(kernels::cuda::WaitFlag(never, 1, kHoldMs * 1'000'000, error, 1, stream->get()).ok());
  constexpr int kUnits = 3000;  // three times what a stream's queue holds
  std::atomic<int> queued{0};
  absl::Status queueing;
  std::thread filler([&] {
    for (int i = 0; i < kUnits && queueing.ok(); ++i) {
      queueing = kernels::cuda::WaitFlag(passed, 0, 1'000'000, error, 1, stream->get());  // passes at once
      if (queueing.ok()) queueing = pacer->Paced(stream->get());
      queued.fetch_add(1);
    }
  });

  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(queued.load(), 64) << "units queued while the stream was held";
  const absl::Time before = absl::Now();
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 4096), cudaSuccess);
  const absl::Duration took = absl::Now() - before;
  cudaFreeHost(pinned);  // after the wait: cudaFreeHost waits for the device
  EXPECT_LT(took, absl::Milliseconds(200)) << "cudaMallocHost waited for the held stream";

  filler.join();
  EXPECT_TRUE(queueing.ok()) << queueing;
  EXPECT_EQ(queued.load(), kUnits);
  EXPECT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
}

TEST(QueuePacerCreateTest, ABoundBelowOneIsInvalid) {
  EXPECT_EQ(QueuePacer::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lamina::cuda
