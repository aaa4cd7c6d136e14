// The device-side data planes' kernels (kernels/cuda/data_plane.h) on one GPU, the two ends on two
// streams: rows handed over behind a flag that a kernel queued ahead spins on, a wait that gives up
// after its timeout, and a send that keeps its flag down once the step has failed; and the same
// for lines (line.h), which carry their own tags instead of a flag; and the hop clocks of every way,
// packets (packets.h, tested on their own in packets_test.cc) among them. Across GPUs and
// processes they run in tests/integration/gpu_cluster_test (cuda_ipc). Skips without a GPU.
#include "kernels/cuda/data_plane.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/cuda/device_buffer.h"
#include "kernels/cuda/packets.h"
#include "gtest/gtest.h"
#include "tests/support/cuda_test_util.h"

namespace lamina::kernels::cuda {
namespace {

using ::lamina::testing::DataPlaneGpuTest;
using ::lamina::testing::Download;
using ::lamina::testing::Upload;

// What both ends of a hop on one GPU need: a pinned error word (zeroed) and a stream each.
struct TwoEnds {
  lamina::cuda::PinnedBuffer error;
  lamina::cuda::Stream receiver, sender;

  static TwoEnds Create() {
    TwoEnds ends;
    auto error = lamina::cuda::PinnedBuffer::Create(sizeof(uint32_t));
    auto receiver = lamina::cuda::Stream::Create();
    auto sender = lamina::cuda::Stream::Create();
    EXPECT_TRUE(error.ok() && receiver.ok() && sender.ok());
    ends.error = std::move(*error);
    *ends.error.as<uint32_t>() = 0;
    ends.receiver = std::move(*receiver);
    ends.sender = std::move(*sender);
    return ends;
  }
  uint32_t* error_word() const { return error.as<uint32_t>(); }
};

using DataPlaneKernelsTest = DataPlaneGpuTest;

// `out` [out_rows, cols] holds, in row dest[i], row i of what was sent (sent(i, c) at column c),
// and -1 in every other row.
template <typename Sent>
void ExpectScattered(const std::vector<float>& out, int64_t out_rows, int64_t cols, const std::vector<int32_t>& dest,
                     Sent sent) {
  for (int64_t r = 0; r < out_rows; ++r) {
    const auto at = std::find(dest.begin(), dest.end(), r);
    for (int64_t c = 0; c < cols; ++c) {
      const float want = at == dest.end() ? -1.f : sent(at - dest.begin(), c);
      ASSERT_EQ(out[r * cols + c], want) << r << "," << c;
    }
  }
}

class DataPlaneRowsTest : public DataPlaneKernelsTest, public ::testing::WithParamInterface<int64_t> {};

TEST_P(DataPlaneRowsTest, RowsArriveBehindTheirFlag) {
  const int64_t cols = GetParam();  // 12: float4 copies; 13: float copies
  const int64_t src_rows = 9;
  std::vector<float> src(src_rows * cols);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f - 7.f;
  const std::vector<int32_t> picked = {4, 1, 8, 0, 5};  // the batch rows sent, in order
  const int64_t n = static_cast<int64_t>(picked.size());
  auto d_src = Upload(src);
  auto d_picked = Upload(picked);
  auto d_received = Upload(std::vector<float>(n * cols, 0.f));
  auto d_out = Upload(std::vector<float>(src_rows * cols, -1.f));
  auto d_flag = Upload(std::vector<uint64_t>{0});
  auto d_arrivals = Upload(std::vector<uint32_t>{0});
  TwoEnds ends = TwoEnds::Create();

  // The receiver's wait is queued first, as a memory node queues a step's layers ahead.
  ASSERT_TRUE(WaitFlag(d_flag.as<uint64_t>(), 3, 5'000'000'000, ends.error_word(), 1, ends.receiver.get()).ok());
  ASSERT_TRUE(ScatterRows(d_received.as<float>(), cols, d_picked.as<int32_t>(), n, cols, d_out.as<float>(), cols,
                          ends.receiver.get())
                  .ok());
  ASSERT_TRUE(SendRows(d_src.as<float>(), cols, d_picked.as<int32_t>(), n, cols, d_received.as<float>(), cols,
                       d_flag.as<uint64_t>(), 3, nullptr, d_arrivals.as<uint32_t>(), ends.sender.get())
                  .ok());
  ASSERT_TRUE(ends.sender.Synchronize().ok());
  ASSERT_TRUE(ends.receiver.Synchronize().ok());

  EXPECT_EQ(*ends.error_word(), 0u);
  EXPECT_EQ(Download<uint64_t>(d_flag, 1)[0], 3u);
  EXPECT_EQ(Download<uint32_t>(d_arrivals, 1)[0], 0u) << "the block counter is left zeroed for the next send";
  const std::vector<float> received = Download<float>(d_received, n * cols);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(received[i * cols + c], src[picked[i] * cols + c]) << i << "," << c;
  }
  // Scattered back: the picked rows hold their own values again, the others are untouched.
  const std::vector<float> out = Download<float>(d_out, src_rows * cols);
  for (int64_t r = 0; r < src_rows; ++r) {
    const bool was_picked = std::find(picked.begin(), picked.end(), r) != picked.end();
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(out[r * cols + c], was_picked ? src[r * cols + c] : -1.f) << r << "," << c;
    }
  }
}

TEST_P(DataPlaneRowsTest, ReceiveRowsWaitsThenScattersInOneLaunch) {
  const int64_t cols = GetParam();
  const int64_t out_rows = 11;
  const std::vector<int32_t> dest = {9, 2, 0, 7, 4, 10};  // where each received row belongs
  const int64_t n = static_cast<int64_t>(dest.size());  // a block each
  std::vector<float> rows(n * cols);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i) * 0.25f + 3.f;
  auto d_rows = Upload(rows);
  auto d_dest = Upload(dest);
  auto d_received = Upload(std::vector<float>(n * cols, 0.f));
  auto d_out = Upload(std::vector<float>(out_rows * cols, -1.f));
  auto d_flag = Upload(std::vector<uint64_t>{0});
  auto d_arrivals = Upload(std::vector<uint32_t>{0});
  TwoEnds ends = TwoEnds::Create();

  // Queued ahead of the rows, as the compute node queues a layer's receive.
  ASSERT_TRUE(ReceiveRows(d_flag.as<uint64_t>(), 4, 5'000'000'000, ends.error_word(), 1, d_received.as<float>(),
                          cols, d_dest.as<int32_t>(), n, cols, d_out.as<float>(), cols, ends.receiver.get())
                  .ok());
  ASSERT_TRUE(SendRows(d_rows.as<float>(), cols, nullptr, n, cols, d_received.as<float>(), cols,
                       d_flag.as<uint64_t>(), 4, nullptr, d_arrivals.as<uint32_t>(), ends.sender.get())
                  .ok());
  ASSERT_TRUE(ends.sender.Synchronize().ok());
  ASSERT_TRUE(ends.receiver.Synchronize().ok());

  EXPECT_EQ(*ends.error_word(), 0u);
  ExpectScattered(Download<float>(d_out, out_rows * cols), out_rows, cols, dest,
                  [&](int64_t i, int64_t c) { return rows[i * cols + c]; });
}

// 12 and 1000: float4 copies; 13 and 1001: float copies; 1000 and 1001 take several batches of
// loads per thread.
INSTANTIATE_TEST_SUITE_P(Columns, DataPlaneRowsTest, ::testing::Values(12, 13, 1000, 1001));

// SendRows' two shapes of launch: a block a piece of a row for fewer than 256 rows (rows of more
// than 4096 floats, or of 1024 when not float4-aligned, in several pieces), a block a pair of rows
// from 256 rows on. Params: rows, cols.
class SendRowsShapesTest : public DataPlaneKernelsTest,
                           public ::testing::WithParamInterface<std::pair<int64_t, int64_t>> {};

TEST_P(SendRowsShapesTest, EveryPieceOfEveryPickedRowArrivesBeforeTheFlag) {
  const auto [n, cols] = GetParam();
  std::vector<float> src(n * cols);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i % 100003) * 0.5f - 11.f;
  std::vector<int32_t> picked(n);  // the rows sent, last first
  for (int64_t i = 0; i < n; ++i) picked[i] = static_cast<int32_t>(n - 1 - i);
  auto d_staged = Upload(src);
  auto d_src = Upload(std::vector<float>(n * cols, 0.f));
  auto d_picked = Upload(picked);
  auto d_received = Upload(std::vector<float>(n * cols, 0.f));
  auto d_flag = Upload(std::vector<uint64_t>{0});
  auto d_arrivals = Upload(std::vector<uint32_t>{0});
  TwoEnds ends = TwoEnds::Create();
  ASSERT_TRUE(WaitFlag(d_flag.as<uint64_t>(), 6, 5'000'000'000, ends.error_word(), 1, ends.receiver.get()).ok());
  // The rows are written by the kernel just before the send (both chained): the send reads them
  // only once that kernel has ended.
  ASSERT_TRUE(ScatterRows(d_staged.as<float>(), cols, nullptr, n, cols, d_src.as<float>(), cols, ends.sender.get()).ok());
  ASSERT_TRUE(SendRows(d_src.as<float>(), cols, d_picked.as<int32_t>(), n, cols, d_received.as<float>(), cols,
                       d_flag.as<uint64_t>(), 6, nullptr, d_arrivals.as<uint32_t>(), ends.sender.get())
                  .ok());
  ASSERT_TRUE(ends.sender.Synchronize().ok());
  ASSERT_TRUE(ends.receiver.Synchronize().ok());
  EXPECT_EQ(*ends.error_word(), 0u);
  EXPECT_EQ(Download<uint64_t>(d_flag, 1)[0], 6u);
  EXPECT_EQ(Download<uint32_t>(d_arrivals, 1)[0], 0u);
  const std::vector<float> received = Download<float>(d_received, n * cols);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(received[i * cols + c], src[picked[i] * cols + c]) << i << "," << c;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SendRowsShapesTest,
                         ::testing::Values(std::pair<int64_t, int64_t>{5, 4100}, std::pair<int64_t, int64_t>{5, 1031},
                                           std::pair<int64_t, int64_t>{255, 6144},
                                           std::pair<int64_t, int64_t>{257, 12}, std::pair<int64_t, int64_t>{257, 13},
                                           std::pair<int64_t, int64_t>{300, 4100}));

// Lines: cols and the source row's stride. (12, 12): float2 loads; (12, 13): floats, as the rows
// are not 8-byte aligned; (1000, 1000): several loads per thread; (6148, 6149): a
// send's row in several pieces (a block each), the last piece short, and floats.
class DataPlaneLinesTest : public DataPlaneKernelsTest,
                           public ::testing::WithParamInterface<std::pair<int64_t, int64_t>> {};

TEST_P(DataPlaneLinesTest, LinesLandInTheirRowsAndStaleOnesDoNotPass) {
  const int64_t cols = GetParam().first, stride = GetParam().second;
  const int64_t src_rows = 9, out_rows = 10;
  const std::vector<int32_t> picked = {4, 1, 8, 0, 5};  // the batch rows sent, in order
  const std::vector<int32_t> dest = {9, 2, 0, 7, 4};    // where each arriving row belongs
  const int64_t n = static_cast<int64_t>(picked.size());
  auto d_picked = Upload(picked);
  auto d_dest = Upload(dest);
  auto d_lines = Upload(std::vector<Line>(n * cols / 2, Line{}));
  TwoEnds ends = TwoEnds::Create();
  // Two hops through the same lines, the second with other values and the next tag.
  for (uint32_t tag : {7u, 8u}) {
    SCOPED_TRACE("tag " + std::to_string(tag));
    std::vector<float> src(src_rows * stride);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f - 7.f * static_cast<float>(tag);
    auto d_src = Upload(src);
    auto d_out = Upload(std::vector<float>(out_rows * cols, -1.f));
    // The receiver polls first, and meanwhile sees the lines of the hop before (or zeros). The
    // second hop's 5 rows are polled by 2 blocks, taking them in turn.
    const int64_t max_blocks = tag == 8u ? 2 : 0;
    ASSERT_TRUE(ReceiveLines(d_lines.as<Line>(), cols, tag, 5'000'000'000, ends.error_word(), 1, d_dest.as<int32_t>(),
                             n, cols, d_out.as<float>(), cols, ends.receiver.get(), max_blocks)
                    .ok());
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_TRUE(SendLines(d_src.as<float>(), stride, d_picked.as<int32_t>(), n, cols, d_lines.as<Line>(), cols, tag,
                          nullptr, ends.sender.get())
                    .ok());
    ASSERT_TRUE(ends.sender.Synchronize().ok());
    ASSERT_TRUE(ends.receiver.Synchronize().ok());
    EXPECT_EQ(*ends.error_word(), 0u);
    ExpectScattered(Download<float>(d_out, out_rows * cols), out_rows, cols, dest,
                    [&](int64_t i, int64_t c) { return src[picked[i] * stride + c]; });
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, DataPlaneLinesTest,
                         ::testing::Values(std::make_pair(int64_t{12}, int64_t{12}),
                                           std::make_pair(int64_t{12}, int64_t{13}),
                                           std::make_pair(int64_t{1000}, int64_t{1000}),
                                           std::make_pair(int64_t{6148}, int64_t{6149})));

TEST_F(DataPlaneKernelsTest, LinesOfAFailedStepAreNotSentAndTheirPollsGiveUp) {
  const int64_t cols = 8, n = 2;
  auto d_src = Upload(std::vector<float>(n * cols, 2.5f));
  auto d_lines = Upload(std::vector<Line>(n * cols / 2, Line{}));
  auto d_out = Upload(std::vector<float>(n * cols, -1.f));
  TwoEnds ends = TwoEnds::Create();
  // A send once the step has failed writes nothing.
  *ends.error_word() = 5;
  ASSERT_TRUE(SendLines(d_src.as<float>(), cols, nullptr, n, cols, d_lines.as<Line>(), cols, 3, ends.error_word(),
                        ends.sender.get())
                  .ok());
  ASSERT_TRUE(ends.sender.Synchronize().ok());
  for (const Line& line : Download<Line>(d_lines, n * cols / 2)) ASSERT_EQ(line.first_tag, 0u);
  // Lines that never come: the poll gives up after 2 ms and says so.
  *ends.error_word() = 0;
  ASSERT_TRUE(ReceiveLines(d_lines.as<Line>(), cols, 3, 2'000'000, ends.error_word(), 6, nullptr, n, cols,
                           d_out.as<float>(), cols, ends.receiver.get())
                  .ok());
  ASSERT_TRUE(ends.receiver.Synchronize().ok());
  EXPECT_EQ(*ends.error_word(), 6u);
  // Once the error word is set, later polls pass at once rather than after their 10 s.
  const absl::Time start = absl::Now();
  ASSERT_TRUE(ReceiveLines(d_lines.as<Line>(), cols, 4, 10'000'000'000, ends.error_word(), 6, nullptr, n, cols,
                           d_out.as<float>(), cols, ends.receiver.get())
                  .ok());
  ASSERT_TRUE(ends.receiver.Synchronize().ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// Hop clocks: how a hop travels (Lines: SendLines, ReceiveLines; Rows: SendRows, ReceiveRows;
// FlagThenScatter: SendRows, WaitFlag then ScatterRows; Packets: SendPackets, ReceivePackets).
enum class HopKind { kLines, kRows, kFlagThenScatter, kPackets };

class HopClockTest : public DataPlaneKernelsTest, public ::testing::WithParamInterface<HopKind> {};

// The receive is queued first and waits; the send is held 30 ms behind a gate on its stream. The
// clocks must time the hop from the send's start after the gate to the rows in place: not the
// gate (the send's stamp taken before the work ahead of it ended), and not the receive's start.
TEST_P(HopClockTest, TimesTheHopFromTheSendsStartToTheRowsInPlace) {
  const int64_t cols = 1000, n = 3;
  std::vector<float> src(n * cols);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f;
  const std::vector<int32_t> dest = {2, 0, 1};
  auto d_src = Upload(src);
  auto d_dest = Upload(dest);
  auto d_lines = Upload(std::vector<Line>(n * cols / 2, Line{}));
  auto d_packets = Upload(std::vector<Packet>(n * PacketsPerRow(cols), Packet{}));
  auto d_received = Upload(std::vector<float>(n * cols, 0.f));
  auto d_out = Upload(std::vector<float>(n * cols, -1.f));
  auto d_flag = Upload(std::vector<uint64_t>{0});
  auto d_arrivals = Upload(std::vector<uint32_t>{0});
  auto d_clock = Upload(std::vector<uint64_t>{~uint64_t{0}, 0});
  uint64_t* sent_at = d_clock.as<uint64_t>();
  uint64_t* back_at = sent_at + 1;
  auto gate = lamina::cuda::PinnedBuffer::Create(sizeof(uint64_t));
  ASSERT_TRUE(gate.ok());
  *gate->as<uint64_t>() = 0;
  TwoEnds ends = TwoEnds::Create();
  cudaStream_t receiver = ends.receiver.get(), sender = ends.sender.get();
  float* out = d_out.as<float>();
  const int32_t* to = d_dest.as<int32_t>();
  switch (GetParam()) {
    case HopKind::kLines:
      ASSERT_TRUE(ReceiveLines(d_lines.as<Line>(), cols, 5, 5'000'000'000, ends.error_word(), 1, to, n, cols, out, cols,
                               receiver, 0, NextKernel::kStartsAtOnce, back_at)
                      .ok());
      break;
    case HopKind::kRows:
      ASSERT_TRUE(ReceiveRows(d_flag.as<uint64_t>(), 5, 5'000'000'000, ends.error_word(), 1, d_received.as<float>(),
                              cols, to, n, cols, out, cols, receiver, back_at)
                      .ok());
      break;
    case HopKind::kFlagThenScatter:
      ASSERT_TRUE(WaitFlag(d_flag.as<uint64_t>(), 5, 5'000'000'000, ends.error_word(), 1, receiver).ok());
      ASSERT_TRUE(ScatterRows(d_received.as<float>(), cols, to, n, cols, out, cols, receiver, back_at).ok());
      break;
    case HopKind::kPackets:
      ASSERT_TRUE(ReceivePackets({d_packets.as<Packet>(), PacketsPerRow(cols), 5, n, cols},
                                 {5'000'000'000, ends.error_word(), 1}, {out, cols, to}, receiver, {back_at})
                      .ok());
      break;
  }
  ASSERT_TRUE(WaitFlag(gate->as<uint64_t>(), 1, 5'000'000'000, ends.error_word(), 2, sender).ok());
  if (GetParam() == HopKind::kLines) {
    ASSERT_TRUE(
        SendLines(d_src.as<float>(), cols, nullptr, n, cols, d_lines.as<Line>(), cols, 5, nullptr, sender, sent_at)
            .ok());
  } else if (GetParam() == HopKind::kPackets) {
    ASSERT_TRUE(SendPackets(d_src.as<float>(), cols, nullptr, n, cols, d_packets.as<Packet>(), PacketsPerRow(cols), 5,
                            nullptr, sender, sent_at)
                    .ok());
  } else {
    ASSERT_TRUE(SendRows(d_src.as<float>(), cols, nullptr, n, cols, d_received.as<float>(), cols,
                         d_flag.as<uint64_t>(), 5, nullptr, d_arrivals.as<uint32_t>(), sender, sent_at)
                    .ok());
  }
  absl::SleepFor(absl::Milliseconds(30));
  __atomic_store_n(gate->as<uint64_t>(), 1, __ATOMIC_RELEASE);
  ASSERT_TRUE(ends.sender.Synchronize().ok());
  ASSERT_TRUE(ends.receiver.Synchronize().ok());
  ASSERT_EQ(*ends.error_word(), 0u);
  ExpectScattered(Download<float>(d_out, n * cols), n, cols, dest,
                  [&](int64_t i, int64_t c) { return src[i * cols + c]; });
  const std::vector<uint64_t> clock = Download<uint64_t>(d_clock, 2);
  ASSERT_NE(clock[0], ~uint64_t{0}) << "the send did not stamp its start";
  ASSERT_NE(clock[1], 0u) << "the receive did not stamp its end";
  EXPECT_GE(clock[1], clock[0]);
  EXPECT_LT(clock[1] - clock[0], 15'000'000u) << "the hop's time holds the 30 ms gate ahead of the send";
}

INSTANTIATE_TEST_SUITE_P(Kinds, HopClockTest,
                         ::testing::Values(HopKind::kLines, HopKind::kRows, HopKind::kFlagThenScatter,
                                           HopKind::kPackets));

TEST_F(DataPlaneKernelsTest, LinesRefuseOddRows) {
  uint32_t* no_error = nullptr;
  absl::Status status = SendLines(nullptr, 8, nullptr, 1, 7, nullptr, 8, 1, no_error, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("7 floats"), std::string::npos) << status;
  status = ReceiveLines(nullptr, 9, 1, 1, no_error, 1, nullptr, 1, 8, nullptr, 8, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  status = ReceiveLines(nullptr, 8, 1, 1, no_error, 1, nullptr, ReceiveRowsMaxCount() + 1, 8, nullptr, 8, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
}

TEST_F(DataPlaneKernelsTest, ReceiveRowsRefusesCountsOutsideItsRange) {
  uint32_t* no_error = nullptr;
  for (int64_t count : {int64_t{0}, ReceiveRowsMaxCount() + 1}) {
    const absl::Status status =
        ReceiveRows(nullptr, 1, 1, no_error, 1, nullptr, 4, nullptr, count, 4, nullptr, 4, nullptr);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << count;
    EXPECT_NE(status.message().find(std::to_string(count) + " rows"), std::string::npos) << status;
  }
}

TEST_F(DataPlaneKernelsTest, GatherRowsPacksPickedRowsInOrder) {
  const int64_t cols = 5, src_stride = 7, src_rows = 6;
  std::vector<float> src(src_rows * src_stride);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) + 0.25f;
  const std::vector<int32_t> picked = {3, 0, 5};
  const int64_t n = static_cast<int64_t>(picked.size());
  auto d_src = Upload(src);
  auto d_picked = Upload(picked);
  auto d_packed = Upload(std::vector<float>(n * cols, 0.f));
  ASSERT_TRUE(GatherRows(d_src.as<float>(), src_stride, d_picked.as<int32_t>(), n, cols, d_packed.as<float>(), cols,
                         nullptr)
                  .ok());
  const std::vector<float> packed = Download<float>(d_packed, n * cols);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(packed[i * cols + c], src[picked[i] * src_stride + c]) << i << "," << c;
    }
  }
}

TEST_F(DataPlaneKernelsTest, AWaitGivesUpAndTheFailedStepKeepsItsFlagsDown) {
  auto d_flag = Upload(std::vector<uint64_t>{5});
  auto d_peer_flag = Upload(std::vector<uint64_t>{0});
  auto d_arrivals = Upload(std::vector<uint32_t>{0});
  auto d_rows = Upload(std::vector<float>(64, 1.f));
  TwoEnds ends = TwoEnds::Create();  // one stream does here
  const cudaStream_t stream = ends.sender.get();
  // A flag already at or past the value passes at once; one that never comes gives up after 2 ms.
  ASSERT_TRUE(WaitFlag(d_flag.as<uint64_t>(), 5, 2'000'000, ends.error_word(), 7, stream).ok());
  ASSERT_TRUE(ends.sender.Synchronize().ok());
  EXPECT_EQ(*ends.error_word(), 0u);
  ASSERT_TRUE(WaitFlag(d_flag.as<uint64_t>(), 6, 2'000'000, ends.error_word(), 7, stream).ok());
  ASSERT_TRUE(SendRows(d_rows.as<float>(), 8, nullptr, 8, 8, d_rows.as<float>(), 8, d_peer_flag.as<uint64_t>(), 9,
                       ends.error_word(), d_arrivals.as<uint32_t>(), stream)
                  .ok());
  ASSERT_TRUE(ends.sender.Synchronize().ok());
  EXPECT_EQ(*ends.error_word(), 7u);
  EXPECT_EQ(Download<uint64_t>(d_peer_flag, 1)[0], 0u) << "a failed step must not tell the peer its rows are there";
}

// The host aborts a step (its peer is gone) by setting the error word while the waits spin: a
// flag's wait and a poll of lines, each with 10 s to wait, then end within moments, and the word
// keeps the abort's code.
TEST_F(DataPlaneKernelsTest, WaitsSpinningWhenTheHostSetsTheErrorWordEndThen) {
  const int64_t cols = 8, n = 2;
  auto d_flag = Upload(std::vector<uint64_t>{0});
  auto d_lines = Upload(std::vector<Line>(n * cols / 2, Line{}));
  auto d_out = Upload(std::vector<float>(n * cols, -1.f));
  TwoEnds ends = TwoEnds::Create();
  constexpr int64_t kTenSeconds = 10'000'000'000;
  ASSERT_TRUE(WaitFlag(d_flag.as<uint64_t>(), 1, kTenSeconds, ends.error_word(), 7, ends.sender.get()).ok());
  ASSERT_TRUE(ReceiveLines(d_lines.as<Line>(), cols, 3, kTenSeconds, ends.error_word(), 7, nullptr, n, cols,
                           d_out.as<float>(), cols, ends.receiver.get())
                  .ok());
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(cudaStreamQuery(ends.sender.get()), cudaErrorNotReady) << "the wait must still be spinning";
  EXPECT_EQ(cudaStreamQuery(ends.receiver.get()), cudaErrorNotReady) << "the poll must still be spinning";
  const absl::Time aborted = absl::Now();
  *const_cast<volatile uint32_t*>(ends.error_word()) = 2;
  ASSERT_TRUE(ends.sender.Synchronize().ok());
  ASSERT_TRUE(ends.receiver.Synchronize().ok());
  EXPECT_LT(absl::Now() - aborted, absl::Seconds(1));
  EXPECT_EQ(*ends.error_word(), 2u) << "the abort's code stays";
}

}  // namespace
}  // namespace lamina::kernels::cuda
