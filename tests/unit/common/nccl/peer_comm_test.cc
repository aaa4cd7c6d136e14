// PeerComm (common/nccl/peer_comm.h): both ranks in this process, on GPUs 0 and 1. Values cross
// both ways; a receive the peer never matches ends, aborted by the watchdog, with DeadlineExceeded
// counted from when the stream reached it;
// a peer that never joins is reported, not waited on. Skips with fewer than two GPUs.
#include "common/nccl/peer_comm.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "common/cuda/device.h"
#include "common/cuda/device_buffer.h"
#include "gtest/gtest.h"
#include "tests/support/cuda_test_util.h"
#include "kernels/cuda/data_plane.h"

namespace lamina::nccl {
namespace {

using testing::DownloadFrom;
using testing::UploadTo;

class PeerCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = NoGpuReason();
    if (!reason.empty()) GTEST_SKIP() << "needs two GPUs: " << reason;
    int gpus = 0;
    ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
    if (gpus < 2) GTEST_SKIP() << "needs two GPUs: this machine has " << gpus;
  }

  // Both ranks, joined.
  void Join(absl::Duration timeout) {
    auto id = NewCommId();
    ASSERT_TRUE(id.ok()) << id.status();
    auto zero = PeerComm::Start(*id, 0, 0, absl::Seconds(60), timeout);
    auto one = PeerComm::Start(*id, 1, 1, absl::Seconds(60), timeout);
    ASSERT_TRUE(zero.ok()) << zero.status();
    ASSERT_TRUE(one.ok()) << one.status();
    ASSERT_TRUE((*zero)->AwaitReady().ok()) << (*zero)->AwaitReady();
    ASSERT_TRUE((*one)->AwaitReady().ok()) << (*one)->AwaitReady();
    rank0_ = *std::move(zero);
    rank1_ = *std::move(one);
  }

  std::unique_ptr<PeerComm> rank0_, rank1_;
};

TEST_F(PeerCommTest, FloatsCrossBothWays) {
  ASSERT_NO_FATAL_FAILURE(Join(absl::Seconds(10)));
  const size_t n = 3000;
  std::vector<float> out(n), back(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(i) * 0.5f;
    back[i] = -static_cast<float>(i);
  }
  auto send0 = UploadTo(0, out), recv0 = UploadTo(0, std::vector<float>(n, 0.f));
  auto send1 = UploadTo(1, back), recv1 = UploadTo(1, std::vector<float>(n, 0.f));
  cudaSetDevice(0);
  auto stream0 = cuda::Stream::Create();
  cudaSetDevice(1);
  auto stream1 = cuda::Stream::Create();
  ASSERT_TRUE(stream0.ok() && stream1.ok());
  // As the data plane queues a layer: rank 0 sends then receives, rank 1 receives then sends.
  ASSERT_TRUE(rank0_->BeginWatch(stream0->get()).ok());
  ASSERT_TRUE(rank0_->Send(send0.as<float>(), n, stream0->get()).ok());
  ASSERT_TRUE(rank0_->Recv(recv0.as<float>(), n, stream0->get()).ok());
  ASSERT_TRUE(rank0_->EndWatch(stream0->get()).ok());
  ASSERT_TRUE(rank1_->Recv(recv1.as<float>(), n, stream1->get()).ok());
  ASSERT_TRUE(rank1_->Send(send1.as<float>(), n, stream1->get()).ok());
  ASSERT_TRUE(stream0->Synchronize().ok());
  ASSERT_TRUE(stream1->Synchronize().ok());
  EXPECT_EQ(DownloadFrom<float>(1, recv1.data(), n), out);
  EXPECT_EQ(DownloadFrom<float>(0, recv0.data(), n), back);
  EXPECT_TRUE(rank0_->health().ok()) << rank0_->health();
}

TEST_F(PeerCommTest, AnUnmatchedReceiveIsAbortedAfterTheTimeout) {
  ASSERT_NO_FATAL_FAILURE(Join(absl::Milliseconds(300)));
  auto recv0 = UploadTo(0, std::vector<float>(16, 0.f));
  cudaSetDevice(0);
  auto stream0 = cuda::Stream::Create();
  ASSERT_TRUE(stream0.ok());
  // The stream is held first by a wait that is not watched (a kernel spinning on a host word), then
  // by a receive that is.
  auto hold = cuda::PinnedBuffer::Create(sizeof(uint64_t) + sizeof(uint32_t));
  ASSERT_TRUE(hold.ok());
  volatile uint64_t* released_word = hold->as<uint64_t>();
  uint32_t* hold_error = reinterpret_cast<uint32_t*>(hold->as<uint64_t>() + 1);
  *released_word = 0;
  *hold_error = 0;
  ASSERT_TRUE(kernels::cuda::PreloadDataPlaneKernels().ok());
  ASSERT_TRUE(kernels::cuda::WaitFlag(hold->as<uint64_t>(), 1, 20'000'000'000, hold_error, 1, stream0->get()).ok());
  ASSERT_TRUE(rank0_->BeginWatch(stream0->get()).ok());
  ASSERT_TRUE(rank0_->Recv(recv0.as<float>(), 16, stream0->get()).ok());
  ASSERT_TRUE(rank0_->EndWatch(stream0->get()).ok());
  absl::SleepFor(absl::Milliseconds(600));
  EXPECT_TRUE(rank0_->health().ok()) << "waiting before the watched work does not count: " << rank0_->health();
  *released_word = 1;
  const absl::Time released = absl::Now();
  // Rank 1 never sends: without the watchdog this would wait forever.
  stream0->Synchronize().IgnoreError();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (rank0_->health().ok() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(absl::IsDeadlineExceeded(rank0_->health())) << rank0_->health();
  EXPECT_LT(absl::Now() - released, absl::Seconds(5));
  EXPECT_NE(rank0_->health().message().find("did not arrive within 300ms"), absl::string_view::npos)
      << rank0_->health();
  EXPECT_FALSE(rank0_->Send(recv0.as<float>(), 16, stream0->get()).ok()) << "an aborted communicator stays failed";
}

TEST_F(PeerCommTest, APeerThatNeverJoinsIsReported) {
  auto id = NewCommId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto alone = PeerComm::Start(*id, 0, 0, absl::Milliseconds(500), absl::Seconds(1));
  ASSERT_TRUE(alone.ok()) << alone.status();
  const absl::Status ready = (*alone)->AwaitReady();
  EXPECT_TRUE(absl::IsDeadlineExceeded(ready)) << ready;
  EXPECT_NE(ready.message().find("did not join within 500ms"), absl::string_view::npos) << ready;
}

TEST(PeerCommArgumentsTest, ABadIdOrRankIsRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(PeerComm::Start("short", 0, 0, absl::Seconds(1), absl::Seconds(1)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      PeerComm::Start(std::string(128, 'x'), 2, 0, absl::Seconds(1), absl::Seconds(1)).status()));
}

}  // namespace
}  // namespace lamina::nccl
