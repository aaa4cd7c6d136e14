// Packets (kernels/cuda/packets.h) on one GPU, the two ends on two streams: rows land in their
// places whatever their width, stride, count and parts, a receiver polling the packets of the hop
// before does not take them, a receive started with its send gets the hop back, a failed step
// sends nothing and its polls give up, and bad shapes are refused. Across two GPUs they run in
// lamina-bench-link-echo. Skips without a GPU.
#include "kernels/cuda/packets.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/time/clock.h"
#include "common/cuda/device_buffer.h"
#include "gtest/gtest.h"
#include "kernels/cuda/data_plane.h"
#include "tests/support/cuda_test_util.h"

namespace lamina::kernels::cuda {
namespace {

using ::lamina::testing::Download;
using ::lamina::testing::ErrorWordGpuTest;
using ::lamina::testing::Upload;

using PacketsTest = ErrorWordGpuTest;

// cols, the source's stride in floats, rows sent, parts a row.
class PacketShapesTest : public PacketsTest,
                         public ::testing::WithParamInterface<std::tuple<int64_t, int64_t, int, int64_t>> {};

TEST_P(PacketShapesTest, RowsLandInTheirPlacesAndStalePacketsDoNotPass) {
  const auto [cols, stride, n, parts] = GetParam();
  const int64_t src_rows = n + 3, out_rows = n + 2, per_row = PacketsPerRow(cols, parts);
  // Each part starts a packet of its own.
  EXPECT_EQ(per_row, parts * ((cols / parts + kPacketFloats - 1) / kPacketFloats));
  std::vector<int32_t> picked(n), dest(n);  // the batch rows sent, in order; where each belongs
  for (int i = 0; i < n; ++i) {
    picked[i] = static_cast<int32_t>((i * 7 + 3) % src_rows);
    dest[i] = static_cast<int32_t>(out_rows - 1 - i);
  }
  auto d_picked = Upload(picked);
  auto d_dest = Upload(dest);
  auto d_packets = Upload(std::vector<Packet>(n * per_row, Packet{}));
  auto receiver = lamina::cuda::Stream::Create();
  auto sender = lamina::cuda::Stream::Create();
  ASSERT_TRUE(receiver.ok() && sender.ok());
  // Two hops through the same packets, the second with other values and the next tag.
  for (uint32_t tag : {7u, 8u}) {
    SCOPED_TRACE("tag " + std::to_string(tag));
    std::vector<float> src(src_rows * stride);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f - 7.f * static_cast<float>(tag);
    auto d_src = Upload(src);
    auto d_out = Upload(std::vector<float>(out_rows * cols, -1.f));
    // The receiver polls first, and meanwhile sees the packets of the hop before (or zeros).
    ASSERT_TRUE(ReceivePackets({d_packets.as<Packet>(), per_row, tag, n, cols, parts},
                               {5'000'000'000, error_.as<uint32_t>(), 1}, {d_out.as<float>(), cols, d_dest.as<int32_t>()},
                               receiver->get())
                    .ok());
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_TRUE(SendPackets(d_src.as<float>(), stride, d_picked.as<int32_t>(), n, cols, d_packets.as<Packet>(),
                            per_row, tag, nullptr, sender->get(), nullptr, parts)
                    .ok());
    ASSERT_TRUE(sender->Synchronize().ok());
    ASSERT_TRUE(receiver->Synchronize().ok());
    ASSERT_EQ(*error_.as<uint32_t>(), 0u);
    const std::vector<float> out = Download<float>(d_out, out_rows * cols);
    for (int64_t r = 0; r < out_rows; ++r) {
      const auto at = std::find(dest.begin(), dest.end(), r);
      for (int64_t c = 0; c < cols; ++c) {
        const float want = at == dest.end() ? -1.f : src[picked[at - dest.begin()] * stride + c];
        ASSERT_EQ(out[r * cols + c], want) << "row " << r << ", col " << c;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PacketShapesTest,
    ::testing::Values(std::make_tuple(int64_t{31}, int64_t{31}, 1, int64_t{1}),  // one whole packet
                      std::make_tuple(int64_t{1}, int64_t{3}, 5, int64_t{1}),    // a float a packet
                      std::make_tuple(int64_t{62}, int64_t{64}, 4, int64_t{1}),
                      std::make_tuple(int64_t{1000}, int64_t{1001}, 5, int64_t{1}),
                      std::make_tuple(int64_t{6144}, int64_t{6144}, 3, int64_t{1}),  // Llama-3-8B's q/k/v rows
                      // Llama-3-8B's attention outputs in a part a kv head (17 packets each).
                      std::make_tuple(int64_t{4096}, int64_t{4100}, 3, int64_t{8}),
                      std::make_tuple(int64_t{6}, int64_t{6}, 4, int64_t{3}),     // parts of 2 floats
                      std::make_tuple(int64_t{124}, int64_t{124}, 2, int64_t{2}),  // 62: two packets a part
                      // Hops polled behind a wait for their first packet, in groups of 4 and 16 rounds.
                      std::make_tuple(int64_t{4096}, int64_t{4096}, 300, int64_t{1}),
                      std::make_tuple(int64_t{6144}, int64_t{6150}, 400, int64_t{1}),
                      std::make_tuple(int64_t{4096}, int64_t{4096}, 500, int64_t{8})));

// A compute end's exchange on one stream, its receive launched to start with its send
// (receive_starts_early, starts_with_send), against an echo on another stream that sends back the
// first 4096 floats of each q/k/v row in a part a kv head, as a memory node's outputs: twice, so
// that the second receive, started early, must not take the first hop's packets.
TEST_F(PacketsTest, AReceiveThatStartsWithItsSendGetsTheHopBack) {
  const int64_t in_cols = 6144, out_cols = 4096, parts = 8, n = 3, out_rows = 5;
  const int64_t in_per_row = PacketsPerRow(in_cols), out_per_row = PacketsPerRow(out_cols, parts);
  ASSERT_LE(ReceivePacketsBlocks(n, out_cols, parts), kMostPacketPollingBlocks);  // polled from the start
  const std::vector<int32_t> dest = {4, 0, 2};
  auto d_dest = Upload(dest);
  auto d_in = Upload(std::vector<Packet>(n * in_per_row, Packet{}));
  auto d_back = Upload(std::vector<Packet>(n * out_per_row, Packet{}));
  auto d_mid = Upload(std::vector<float>(n * in_cols, 0.f));
  auto exchange = lamina::cuda::Stream::Create();
  auto echo = lamina::cuda::Stream::Create();
  ASSERT_TRUE(exchange.ok() && echo.ok());
  uint32_t* error = error_.as<uint32_t>();
  for (uint32_t tag : {7u, 8u}) {
    SCOPED_TRACE("tag " + std::to_string(tag));
    std::vector<float> src(n * in_cols);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i % 977) * 0.25f + static_cast<float>(tag);
    auto d_src = Upload(src);
    auto d_out = Upload(std::vector<float>(out_rows * out_cols, -1.f));
    ASSERT_TRUE(ReceivePackets({d_in.as<Packet>(), in_per_row, tag, n, in_cols}, {5'000'000'000, error, 1},
                               {d_mid.as<float>(), in_cols}, echo->get())
                    .ok());
    ASSERT_TRUE(SendPackets(d_mid.as<float>(), in_cols, nullptr, n, out_cols, d_back.as<Packet>(), out_per_row, tag,
                            error, echo->get(), nullptr, parts)
                    .ok());
    ASSERT_TRUE(SendPackets(d_src.as<float>(), in_cols, nullptr, n, in_cols, d_in.as<Packet>(), in_per_row, tag, error,
                            exchange->get(), nullptr, 1, /*receive_starts_early=*/true)
                    .ok());
    ASSERT_TRUE(ReceivePackets({d_back.as<Packet>(), out_per_row, tag, n, out_cols, parts}, {5'000'000'000, error, 2},
                               {d_out.as<float>(), out_cols, d_dest.as<int32_t>()}, exchange->get(),
                               {nullptr, kMostPacketPollingBlocks, /*starts_with_send=*/true})
                    .ok());
    ASSERT_TRUE(exchange->Synchronize().ok());
    ASSERT_TRUE(echo->Synchronize().ok());
    ASSERT_EQ(*error, 0u);
    const std::vector<float> out = Download<float>(d_out, out_rows * out_cols);
    for (int64_t r = 0; r < out_rows; ++r) {
      const auto at = std::find(dest.begin(), dest.end(), r);
      for (int64_t c = 0; c < out_cols; ++c) {
        const float want = at == dest.end() ? -1.f : src[(at - dest.begin()) * in_cols + c];
        ASSERT_EQ(out[r * out_cols + c], want) << "row " << r << ", col " << c;
      }
    }
  }
}

TEST_F(PacketsTest, PacketsOfAFailedStepAreNotSentAndTheirPollsGiveUp) {
  const int64_t cols = 100, n = 2, per_row = PacketsPerRow(cols);
  auto d_src = Upload(std::vector<float>(n * cols, 2.5f));
  auto d_packets = Upload(std::vector<Packet>(n * per_row, Packet{}));
  auto d_out = Upload(std::vector<float>(n * cols, -1.f));
  auto stream = lamina::cuda::Stream::Create();
  ASSERT_TRUE(stream.ok());
  uint32_t* error = error_.as<uint32_t>();
  // A send once the step has failed writes nothing.
  *error = 5;
  ASSERT_TRUE(
      SendPackets(d_src.as<float>(), cols, nullptr, n, cols, d_packets.as<Packet>(), per_row, 3, error, stream->get())
          .ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  for (const Packet& packet : Download<Packet>(d_packets, n * per_row)) ASSERT_EQ(packet.tag, 0u);
  // Packets that never come: the poll gives up after 2 ms and says so.
  *error = 0;
  ASSERT_TRUE(ReceivePackets({d_packets.as<Packet>(), per_row, 3, n, cols}, {2'000'000, error, 6},
                             {d_out.as<float>(), cols}, stream->get())
                  .ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(*error, 6u);
  // Once the error word is set, later polls pass at once rather than after their 10 s.
  const absl::Time start = absl::Now();
  ASSERT_TRUE(ReceivePackets({d_packets.as<Packet>(), per_row, 4, n, cols}, {10'000'000'000, error, 6},
                             {d_out.as<float>(), cols}, stream->get())
                  .ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // The same for a hop large enough to wait behind its first packet.
  const int64_t many = 1200;  // 4800 packets: 38 blocks
  auto d_many = Upload(std::vector<Packet>(many * per_row, Packet{}));
  auto d_many_out = Upload(std::vector<float>(many * cols, -1.f));
  *error = 0;
  ASSERT_TRUE(ReceivePackets({d_many.as<Packet>(), per_row, 3, many, cols}, {2'000'000, error, 7},
                             {d_many_out.as<float>(), cols}, stream->get())
                  .ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(*error, 7u);
}

TEST_F(PacketsTest, ShapesThePacketsCannotHoldAreRefused) {
  // 32 floats take two packets a row, not one.
  absl::Status status = SendPackets(nullptr, 32, nullptr, 1, 32, nullptr, 1, 1, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("at least 2"), std::string::npos) << status;
  status = ReceivePackets({nullptr, 1, 1, 1, 32}, {1, nullptr, 1}, {nullptr, 32}, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  status = ReceivePackets({nullptr, 2, 1, -1, 32}, {1, nullptr, 1}, {nullptr, 32}, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  // 64 floats in 2 parts take two packets a row, in 4 parts four.
  status = SendPackets(nullptr, 64, nullptr, 1, 64, nullptr, 3, 1, nullptr, nullptr, nullptr, 4);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("at least 4"), std::string::npos) << status;
  // Parts of a row must hold whole floats, and be one at least.
  for (const int64_t parts : {int64_t{3}, int64_t{0}}) {
    status = ReceivePackets({nullptr, 8, 1, 1, 64, parts}, {1, nullptr, 1}, {nullptr, 64}, nullptr);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("parts"), std::string::npos) << status;
  }
}

}  // namespace
}  // namespace lamina::kernels::cuda
