// A device lane of the GPU KV pool (kv/attention/kv_backend.h): a linked chunk (the hop
// folded into the attention launch) gives the outputs of an unlinked one, raises its done flag,
// and both count their device time in TakeBusy, which a memory node's busy fraction reports; the
// linked chunks of a step run side by side, a chunk whose rows are there not waiting for one
// whose rows are not; a launch too large to wait on its flag itself waits behind one queued
// ahead; a chunk that travels as lines runs whatever plan its share gave it; lanes
// waiting for their rows leave SMs to a lane whose rows came; a float8 pool attends as the CPU's
// float8 pool does, over the same quantized bits, and its linked chunks match its unlinked ones;
// a step's chunk streams come with its lane, so a step starts while another stream's wait spins.
// Skips without a GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "common/cuda/device.h"
#include "common/cuda/device_buffer.h"
#include "common/tensor/dtype.h"
#include "common/threading/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/data_plane.h"
#include "kernels/cuda/line.h"
#include "kernels/cuda/packets.h"
#include "kv/attention/kv_backend.h"
#include "tests/support/cuda_test_util.h"

namespace lamina {
namespace {

using cuda::DeviceBuffer;
using testing::Download;
using testing::Peek;
using testing::Upload;

// A hop whose outputs go to `out` [rows, out_stride], raising *done to done_value, its waits
// giving up after `timeout_ns` with code 1 in *error; its inputs in place until the caller says
// how they arrive.
DeviceHop OutputHop(uint32_t* error, float* out, int64_t out_stride, uint64_t* done, uint64_t done_value,
                    int64_t timeout_ns) {
  DeviceHop hop;
  hop.timeout_ns = timeout_ns;
  hop.error = error;
  hop.error_code = 1;
  hop.out = DeviceHop::RowsOut{out, out_stride, done, done_value};
  return hop;
}

TEST(CudaKvLaneTest, LinkedChunkMatchesUnlinkedAndBothCountTheirDeviceTime) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  const kernels::cpu::AttentionShape shape{4, 2, 16, 0};
  const int64_t q = 64, kv = 32, row = q + 2 * kv;
  auto backend = CreateCudaKvBackend({2, 64, shape}, 0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto lane = (*backend)->NewDeviceLane(1);
  ASSERT_TRUE(lane.ok()) << lane.status();
  // Two sequences: one attending to slots 1, 2, 5 (writing 5), one to slot 9 alone.
  ASSERT_TRUE((*lane)->SetStep({5, 9}, {1, 2, 5, 9}, {0, 3, 4}, 1).ok());
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> qkv(2 * row);
  for (float& x : qkv) x = dist(rng);
  DeviceBuffer d_qkv = Upload(qkv);
  DeviceBuffer ready = Upload(std::vector<uint64_t>{1});
  DeviceBuffer done = Upload(std::vector<uint64_t>{0});
  DeviceBuffer error = Upload(std::vector<uint32_t>{0});
  DeviceBuffer out = Upload(std::vector<float>(2 * q, 0.f));
  const QkvLayout layout{row, 0, q, q + kv};

  DeviceHop hop = OutputHop(error.as<uint32_t>(), out.as<float>(), q, done.as<uint64_t>(), 4, 5'000'000'000);
  hop.in = DeviceHop::FlagIn{ready.as<uint64_t>(), 1};
  ASSERT_TRUE((*lane)->QueueLinkedChunk(0, 0, d_qkv.as<float>(), layout, hop).ok());
  ASSERT_TRUE((*lane)->Synchronize().ok());
  auto linked_busy = (*lane)->TakeBusy();
  ASSERT_TRUE(linked_busy.ok()) << linked_busy.status();
  EXPECT_GT(*linked_busy, absl::ZeroDuration());
  EXPECT_LT(*linked_busy, absl::Seconds(1));
  EXPECT_EQ(Download<uint64_t>(done.data(), 1)[0], 4u);
  EXPECT_EQ(Download<uint32_t>(error.data(), 1)[0], 0u);
  auto nothing = (*lane)->TakeBusy();
  ASSERT_TRUE(nothing.ok());
  EXPECT_EQ(*nothing, absl::ZeroDuration()) << "TakeBusy counts each chunk once";

  // The same layer again, unlinked: the same k/v stored, the same outputs, in the lane's own rows.
  ASSERT_TRUE((*lane)->QueueChunk(0, 0, d_qkv.as<float>(), layout).ok());
  ASSERT_TRUE((*lane)->Synchronize().ok());
  auto unlinked_busy = (*lane)->TakeBusy();
  ASSERT_TRUE(unlinked_busy.ok()) << unlinked_busy.status();
  EXPECT_GT(*unlinked_busy, absl::ZeroDuration());
  EXPECT_EQ(Download<float>(out.data(), 2 * q), Download<float>((*lane)->step_out(), 2 * q));
}

// A float8 pool on the GPU against one on the CPU: the prompt's k/v stored (host path), then a
// decode step whose new token is stored and attended on a lane, linked and unlinked. Both pools
// quantize each head alike, so the GPU attends over the CPU's values: its outputs are the CPU's
// within the kernels' tolerances, and the linked chunk's are the unlinked one's, bit for bit.
TEST(CudaKvLaneTest, AFloat8PoolStoresTheCpuPoolsBitsAndAttendsAsItDoes) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  const kernels::cpu::AttentionShape shape{8, 4, 32, 0};  // the demo model's
  const int64_t q = 256, kv = 128, row = q + 2 * kv, prompt = 150;
  const KvBackendOptions options{2, 256, shape, DType::kF8E4M3};
  auto gpu = CreateCudaKvBackend(options, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto cpu = CreateCpuKvBackend(options, &ThreadPool::Default());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.f, 3.f);
  std::vector<float> qkv((prompt + 1) * row);
  for (float& x : qkv) x = dist(rng);
  // Slots 200, 199, ... for the prompt and 40 for the new token.
  std::vector<int32_t> slots(prompt);
  for (int64_t t = 0; t < prompt; ++t) slots[t] = static_cast<int32_t>(200 - t);
  for (KvBackend* pool : {gpu->get(), cpu->get()}) {
    ASSERT_TRUE(pool->Store(1, slots, &qkv[q], &qkv[q + kv], row).ok());
  }
  std::vector<int32_t> context = slots;
  context.push_back(40);
  const float* step = &qkv[prompt * row];
  ASSERT_TRUE((*cpu)->Store(1, {40}, step + q, step + q + kv, row).ok());
  ASSERT_TRUE((*cpu)->SetContexts(context, {0, prompt + 1}).ok());
  std::vector<float> want(q);
  ASSERT_TRUE((*cpu)->Attend(1, step, row, want.data(), q).ok());

  auto lane = (*gpu)->NewDeviceLane(1);
  ASSERT_TRUE(lane.ok()) << lane.status();
  ASSERT_TRUE((*lane)->SetStep({40}, context, {0, prompt + 1}, 1).ok());
  DeviceBuffer d_step = Upload(std::vector<float>(step, step + row));
  const QkvLayout layout{row, 0, q, q + kv};
  ASSERT_TRUE((*lane)->QueueChunk(1, 0, d_step.as<float>(), layout).ok());
  ASSERT_TRUE((*lane)->Synchronize().ok());
  const std::vector<float> unlinked = Download<float>((*lane)->step_out(), q);
  float largest = 0;
  for (float x : want) largest = std::max(largest, std::fabs(x));
  for (int64_t i = 0; i < q; ++i) {
    ASSERT_NEAR(unlinked[i], want[i], 2e-4f * largest + 2e-3f * std::fabs(want[i])) << "output " << i;
  }

  DeviceBuffer ready = Upload(std::vector<uint64_t>{1});
  DeviceBuffer done = Upload(std::vector<uint64_t>{0});
  DeviceBuffer error = Upload(std::vector<uint32_t>{0});
  DeviceBuffer out = Upload(std::vector<float>(q, 0.f));
  ASSERT_TRUE((*lane)->SetStep({40}, context, {0, prompt + 1}, 1).ok());
  DeviceHop hop = OutputHop(error.as<uint32_t>(), out.as<float>(), q, done.as<uint64_t>(), 4, 5'000'000'000);
  hop.in = DeviceHop::FlagIn{ready.as<uint64_t>(), 1};
  ASSERT_TRUE((*lane)->QueueLinkedChunk(1, 0, d_step.as<float>(), layout, hop).ok());
  ASSERT_TRUE((*lane)->Synchronize().ok());
  EXPECT_EQ(Download<uint64_t>(done.data(), 1)[0], 4u);
  EXPECT_EQ(Download<float>(out.data(), q), unlinked);
}

TEST(CudaKvLaneTest, LinkedChunksRunSideBySide) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  const kernels::cpu::AttentionShape shape{4, 2, 16, 0};
  const int64_t q = 64, kv = 32, row = q + 2 * kv;
  auto backend = CreateCudaKvBackend({1, 64, shape}, 0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto lane = (*backend)->NewDeviceLane(2);
  ASSERT_TRUE(lane.ok()) << lane.status();
  // Four sequences in two chunks of two: contexts of 3, 1, 2 and 4 slots, each writing its last.
  ASSERT_TRUE((*lane)->SetStep({2, 3, 5, 9}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {0, 3, 4, 6, 10}, 2).ok());
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> qkv(4 * row);
  for (float& x : qkv) x = dist(rng);
  DeviceBuffer d_qkv = Upload(qkv);
  DeviceBuffer ready = Upload(std::vector<uint64_t>{0, 1});  // chunk 0's rows have not arrived
  DeviceBuffer done = Upload(std::vector<uint64_t>{0, 0});
  DeviceBuffer error = Upload(std::vector<uint32_t>{0});
  DeviceBuffer out = Upload(std::vector<float>(4 * q, 0.f));
  const QkvLayout layout{row, 0, q, q + kv};
  for (int c = 0; c < 2; ++c) {
    DeviceHop hop = OutputHop(error.as<uint32_t>(), out.as<float>() + 2 * c * q, q, done.as<uint64_t>() + c, 7,
                              10'000'000'000);
    hop.in = DeviceHop::FlagIn{ready.as<uint64_t>() + c, 1};
    ASSERT_TRUE((*lane)->QueueLinkedChunk(0, c, d_qkv.as<float>(), layout, hop).ok());
  }
  // Chunk 1 finishes while chunk 0, queued before it, still waits for its rows.
  bool chunk1_done = false;
  for (int i = 0; i < 2000 && !chunk1_done; ++i) {
    chunk1_done = Peek<uint64_t>(done.data(), 2)[1] == 7;
    if (!chunk1_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(chunk1_done) << "chunk 1 waited for chunk 0";
  EXPECT_EQ(Peek<uint64_t>(done.data(), 2)[0], 0u) << "chunk 0 ran before its rows arrived";
  const uint64_t arrived = 1;
  ASSERT_EQ(cudaMemcpy(ready.as<uint64_t>(), &arrived, sizeof(arrived), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE((*lane)->Synchronize().ok());
  EXPECT_EQ(Download<uint64_t>(done.data(), 2), (std::vector<uint64_t>{7, 7}));
  EXPECT_EQ(Download<uint32_t>(error.data(), 1)[0], 0u);
  auto busy = (*lane)->TakeBusy();
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_GT(*busy, absl::ZeroDuration());
  EXPECT_LT(*busy, absl::Seconds(1)) << "the wait for chunk 0's rows is not busy time";

  // The same chunks unlinked, one after the other on the lane's stream: the same outputs.
  for (int c = 0; c < 2; ++c) ASSERT_TRUE((*lane)->QueueChunk(0, c, d_qkv.as<float>(), layout).ok());
  ASSERT_TRUE((*lane)->Synchronize().ok());
  EXPECT_EQ(Download<float>(out.data(), 4 * q), Download<float>((*lane)->step_out(), 4 * q));
}

// A launch of more blocks than may wait on a flag in the launch (24, past 16) waits behind a
// WaitFlag queued ahead, chained to it: nothing runs before the rows' flag is up, the outputs then
// equal an unlinked chunk's, and the wait is not busy time.
TEST(CudaKvLaneTest, ALaunchTooLargeToWaitInItselfWaitsBehindAFlagAheadAndMatchesUnlinked) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  const kernels::cpu::AttentionShape shape{4, 2, 16, 0};
  const int64_t q = 64, kv = 32, row = q + 2 * kv, seqs = 12;
  auto backend = CreateCudaKvBackend({1, 64, shape}, 0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto lane = (*backend)->NewDeviceLane(1);
  ASSERT_TRUE(lane.ok()) << lane.status();
  // Twelve sequences of two slots each (2i and 2i + 1), each writing its second: 24 (sequence, kv
  // head) pairs, too short a context to split.
  std::vector<int32_t> write, slots(2 * seqs);
  std::vector<int64_t> begin;
  std::iota(slots.begin(), slots.end(), 0);
  for (int32_t i = 0; i < seqs; ++i) {
    write.push_back(2 * i + 1);
    begin.push_back(2 * i);
  }
  begin.push_back(2 * seqs);
  ASSERT_TRUE((*lane)->SetStep(write, slots, begin, 1).ok());
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> qkv(seqs * row);
  for (float& x : qkv) x = dist(rng);
  DeviceBuffer d_qkv = Upload(qkv);
  DeviceBuffer ready = Upload(std::vector<uint64_t>{0});
  DeviceBuffer done = Upload(std::vector<uint64_t>{0});
  DeviceBuffer error = Upload(std::vector<uint32_t>{0});
  DeviceBuffer out = Upload(std::vector<float>(seqs * q, 0.f));
  const QkvLayout layout{row, 0, q, q + kv};
  DeviceHop hop = OutputHop(error.as<uint32_t>(), out.as<float>(), q, done.as<uint64_t>(), 3, 10'000'000'000);
  hop.in = DeviceHop::FlagIn{ready.as<uint64_t>(), 1};
  ASSERT_TRUE((*lane)->QueueLinkedChunk(0, 0, d_qkv.as<float>(), layout, hop).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(Peek<uint64_t>(done.data(), 1)[0], 0u) << "the launch ran before its rows' flag was up";
  const uint64_t arrived = 1;
  ASSERT_EQ(cudaMemcpy(ready.as<uint64_t>(), &arrived, sizeof(arrived), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE((*lane)->Synchronize().ok());
  EXPECT_EQ(Download<uint64_t>(done.data(), 1)[0], 3u);
  EXPECT_EQ(Download<uint32_t>(error.data(), 1)[0], 0u);
  auto busy = (*lane)->TakeBusy();
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_GT(*busy, absl::ZeroDuration());
  EXPECT_LT(*busy, absl::Milliseconds(200)) << "the 300 ms wait for the rows is not busy time";

  ASSERT_TRUE((*lane)->QueueChunk(0, 0, d_qkv.as<float>(), layout).ok());
  ASSERT_TRUE((*lane)->Synchronize().ok());
  EXPECT_EQ(Download<float>(out.data(), seqs * q), Download<float>((*lane)->step_out(), seqs * q));
}

// A chunk that arrives and leaves as lines, in a step of so many chunks that its share of the GPU
// plans it a warp per (sequence, kv head), which lines cannot take: the lane runs it a block per
// head, with the outputs of the same chunk unlinked.
TEST(CudaKvLaneTest, LinesOfAChunkPlannedAWarpPerHeadGoABlockPerHead) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  const kernels::cpu::AttentionShape shape{8, 8, 16, 0};
  const int64_t q = 128, kv = 128, row = q + 2 * kv;
  // 256 sequences of one token each (its own slot) in 64 chunks of 4: each chunk's share is 1 to 3
  // SMs, where 4 rows of 8 kv heads make a warp-per-head plan.
  const int64_t seqs = 256, chunks = 64, rows = seqs / chunks;
  auto backend = CreateCudaKvBackend({1, seqs, shape}, 0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto lane = (*backend)->NewDeviceLane(chunks);
  ASSERT_TRUE(lane.ok()) << lane.status();
  std::vector<int32_t> slots(seqs);
  std::vector<int64_t> begins(seqs + 1);
  std::iota(slots.begin(), slots.end(), 0);
  std::iota(begins.begin(), begins.end(), 0);
  ASSERT_TRUE((*lane)->SetStep(slots, slots, begins, chunks).ok());
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> qkv(rows * row);
  for (float& x : qkv) x = dist(rng);
  DeviceBuffer source = Upload(qkv);
  DeviceBuffer mirror = Upload(std::vector<float>(rows * row, 0.f));  // where the lines are put in place
  DeviceBuffer in_lines = Upload(std::vector<kernels::cuda::Line>(rows * row / 2, kernels::cuda::Line{}));
  DeviceBuffer out_lines = Upload(std::vector<kernels::cuda::Line>(rows * q / 2, kernels::cuda::Line{}));
  DeviceBuffer done = Upload(std::vector<uint64_t>{0});
  DeviceBuffer error = Upload(std::vector<uint32_t>{0});
  DeviceBuffer out = Upload(std::vector<float>(rows * q, -1.f));
  const QkvLayout layout{row, 0, q, q + kv};
  const uint32_t tag = kernels::cuda::LineTag(3);
  DeviceHop hop = OutputHop(error.as<uint32_t>(), out.as<float>(), q, done.as<uint64_t>(), 3, 5'000'000'000);
  hop.in = DeviceHop::LinesIn{in_lines.as<kernels::cuda::Line>(), mirror.as<float>()};
  hop.out = DeviceHop::LinesOut{out_lines.as<kernels::cuda::Line>(), out.as<float>(), q};
  hop.tag = tag;
  auto sender = cuda::Stream::Create();
  ASSERT_TRUE(sender.ok());
  const auto send = [&](uint32_t tag) {
    return kernels::cuda::SendLines(source.as<float>(), row, nullptr, rows, row, in_lines.as<kernels::cuda::Line>(),
                                    row, tag, nullptr, sender->get());
  };
  // The lines of an earlier hop first, which must not pass for this one. They also load the send's
  // kernel, which CUDA's lazy loading would do only once the spinning launch below has ended.
  ASSERT_TRUE(send(kernels::cuda::LineTag(2)).ok());
  ASSERT_TRUE(sender->Synchronize().ok());
  absl::Status queued = (*lane)->QueueLinkedChunk(0, 0, mirror.as<float>(), layout, hop);
  ASSERT_TRUE(queued.ok()) << queued;
  ASSERT_TRUE(send(tag).ok());
  ASSERT_TRUE(sender->Synchronize().ok());
  ASSERT_TRUE((*lane)->Synchronize().ok());
  EXPECT_EQ(Download<uint32_t>(error.data(), 1)[0], 0u);
  EXPECT_EQ(Download<uint64_t>(done.data(), 1)[0], 0u) << "lines go back with no flag: the compute end polls them";
  std::vector<float> got;
  for (const kernels::cuda::Line& line : Download<kernels::cuda::Line>(out_lines.data(), rows * q / 2)) {
    ASSERT_EQ(line.first_tag, tag);
    ASSERT_EQ(line.second_tag, tag);
    got.push_back(line.first);
    got.push_back(line.second);
  }

  ASSERT_TRUE((*lane)->QueueChunk(0, 0, source.as<float>(), layout).ok());
  ASSERT_TRUE((*lane)->Synchronize().ok());
  EXPECT_EQ(got, Download<float>((*lane)->step_out(), rows * q));
}

// A chunk whose q/k/v come as packets (cuda_ipc's larger chunks), each sequence attending to
// `context` tokens (the last its new one): polled by the launch's blocks from the start (4 rows:
// 32 blocks), by them once a wait queued ahead has seen the first packet (32 rows of 24 tokens: 256
// blocks, past the spin budget), or by the warps of a warp-per-head launch (32 rows of a token,
// which PlanDecode gives blocks but kc::PlanPolledDecode a warp each; 512 rows: there too once
// the first packet is in, also of 24 tokens and of 100, the new one in a warp's second turn of
// tokens); the outputs go back as packets, equal to an unlinked chunk's, and no done flag is
// raised. In a part a kv head, each block or warp sends its own; in one part, the lane sends them
// after the launch. With a second lane on the GPU (idle), whose budget counts each block as an SM,
// a warp per query head of 16 to 32 rows (128 to 256 pairs) takes blocks of 2 or 4 pairs on a GPU
// of 132 SMs (FewestPairsPerBlock).
class CudaKvLanePacketsTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, int>> {};

TEST_P(CudaKvLanePacketsTest, PacketsArePolledByTheLaunchAndTheOutputsGoBackAsPackets) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  namespace kc = kernels::cuda;
  const kernels::cpu::AttentionShape shape{8, 8, 16, 0};
  const int64_t q = 128, kv = 128, row = q + 2 * kv;
  // Plain variables, not a structured binding: the lambdas below capture them.
  const int64_t rows = std::get<0>(GetParam()), parts = std::get<1>(GetParam()), context = std::get<2>(GetParam());
  const int lanes = std::get<3>(GetParam());
  const int64_t in_per_row = kc::PacketsPerRow(row), out_per_row = kc::PacketsPerRow(q, parts);
  const int64_t part_floats = q / parts, per_part = kc::PacketsPerRow(part_floats);
  auto backend = CreateCudaKvBackend({1, rows * context, shape}, 0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto lane = (*backend)->NewDeviceLane(1);
  ASSERT_TRUE(lane.ok()) << lane.status();
  std::vector<std::unique_ptr<DeviceKvLane>> idle;
  for (int i = 1; i < lanes; ++i) {
    auto other = (*backend)->NewDeviceLane(1);
    ASSERT_TRUE(other.ok()) << other.status();
    idle.push_back(std::move(*other));
  }
  // Sequence r holds slots [r * context, (r + 1) * context), its new token in the last.
  std::vector<int32_t> slots(rows * context), write(rows), earlier;
  std::vector<int64_t> begins(rows + 1);
  std::iota(slots.begin(), slots.end(), 0);
  for (int64_t r = 0; r <= rows; ++r) begins[r] = r * context;
  for (int64_t r = 0; r < rows; ++r) {
    write[r] = static_cast<int32_t>((r + 1) * context - 1);
    for (int64_t t = 0; t + 1 < context; ++t) earlier.push_back(static_cast<int32_t>(r * context + t));
  }
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  if (!earlier.empty()) {
    std::vector<float> k(earlier.size() * kv), v(earlier.size() * kv);
    for (float& x : k) x = dist(rng);
    for (float& x : v) x = dist(rng);
    ASSERT_TRUE((*backend)->Store(0, earlier, k.data(), v.data(), kv).ok());
  }
  ASSERT_TRUE((*lane)->SetStep(write, slots, begins, 1).ok());
  std::vector<float> qkv(rows * row);
  for (float& x : qkv) x = dist(rng);
  DeviceBuffer source = Upload(qkv);
  DeviceBuffer mirror = Upload(std::vector<float>(rows * row, 0.f));  // where the packets are put in place
  DeviceBuffer in_packets = Upload(std::vector<kc::Packet>(rows * in_per_row, kc::Packet{}));
  DeviceBuffer out_packets = Upload(std::vector<kc::Packet>(rows * out_per_row, kc::Packet{}));
  DeviceBuffer done = Upload(std::vector<uint64_t>{0});
  DeviceBuffer error = Upload(std::vector<uint32_t>{0});
  const QkvLayout layout{row, 0, q, q + kv};
  const uint32_t tag = kc::LineTag(3);
  DeviceHop hop = OutputHop(error.as<uint32_t>(), nullptr, 0, nullptr, 3, 5'000'000'000);
  hop.in = DeviceHop::PacketsIn{in_packets.as<kc::Packet>(), mirror.as<float>()};
  hop.out = DeviceHop::PacketsOut{out_packets.as<kc::Packet>(), parts};
  hop.tag = tag;
  auto sender = cuda::Stream::Create();
  ASSERT_TRUE(sender.ok());
  const auto send = [&](uint32_t tag) {
    return kc::SendPackets(source.as<float>(), row, nullptr, rows, row, in_packets.as<kc::Packet>(), in_per_row, tag,
                           nullptr, sender->get());
  };
  // First a hop whose packets are in before its launch: it loads every kernel of the path, which
  // CUDA's lazy loading would do only once the spinning poll below has ended. Its packets must not
  // pass for the next hop's.
  ASSERT_TRUE(send(kc::LineTag(2)).ok());
  ASSERT_TRUE(sender->Synchronize().ok());
  hop.tag = kc::LineTag(2);
  ASSERT_TRUE((*lane)->QueueLinkedChunk(0, 0, mirror.as<float>(), layout, hop).ok());
  ASSERT_TRUE((*lane)->Synchronize().ok());
  ASSERT_EQ(Download<uint32_t>(error.data(), 1)[0], 0u);
  // Then a hop whose poll starts before its packets are sent.
  hop.tag = tag;
  absl::Status queued = (*lane)->QueueLinkedChunk(0, 0, mirror.as<float>(), layout, hop);
  ASSERT_TRUE(queued.ok()) << queued;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(send(tag).ok());
  ASSERT_TRUE(sender->Synchronize().ok());
  ASSERT_TRUE((*lane)->Synchronize().ok());
  EXPECT_EQ(Download<uint32_t>(error.data(), 1)[0], 0u);
  EXPECT_EQ(Download<uint64_t>(done.data(), 1)[0], 0u);
  const std::vector<kc::Packet> packets = Download<kc::Packet>(out_packets.data(), rows * out_per_row);
  std::vector<float> got(rows * q);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < out_per_row; ++k) {
      const kc::Packet& packet = packets[r * out_per_row + k];
      ASSERT_EQ(packet.tag, tag) << "row " << r << ", packet " << k;
      const int64_t first = k / per_part * part_floats + k % per_part * kc::kPacketFloats;
      for (int64_t j = 0; j < kc::kPacketFloats && k % per_part * kc::kPacketFloats + j < part_floats; ++j) {
        got[r * q + first + j] = packet.values[j];
      }
    }
  }

  ASSERT_TRUE((*lane)->QueueChunk(0, 0, source.as<float>(), layout).ok());
  ASSERT_TRUE((*lane)->Synchronize().ok());
  EXPECT_EQ(got, Download<float>((*lane)->step_out(), rows * q));
}

INSTANTIATE_TEST_SUITE_P(
    RowsPartsAndContexts, CudaKvLanePacketsTest,
    ::testing::Values(std::make_tuple(int64_t{4}, int64_t{8}, int64_t{1}, 1),
                      std::make_tuple(int64_t{4}, int64_t{1}, int64_t{1}, 1),
                      std::make_tuple(int64_t{32}, int64_t{8}, int64_t{24}, 1),
                      std::make_tuple(int64_t{32}, int64_t{1}, int64_t{24}, 1),
                      std::make_tuple(int64_t{32}, int64_t{8}, int64_t{1}, 1),
                      std::make_tuple(int64_t{32}, int64_t{1}, int64_t{1}, 1),
                      std::make_tuple(int64_t{512}, int64_t{8}, int64_t{1}, 1),
                      std::make_tuple(int64_t{512}, int64_t{1}, int64_t{1}, 1),
                      std::make_tuple(int64_t{512}, int64_t{8}, int64_t{24}, 1),
                      std::make_tuple(int64_t{512}, int64_t{1}, int64_t{100}, 1),
                      std::make_tuple(int64_t{16}, int64_t{8}, int64_t{1}, 2),
                      std::make_tuple(int64_t{24}, int64_t{8}, int64_t{1}, 2),
                      std::make_tuple(int64_t{32}, int64_t{1}, int64_t{1}, 2)));

// Lanes of one GPU whose rows have not come must leave SMs to a lane whose rows have: the compute
// node may send their rows only once that lane's outputs are back. Llama-3-8B's layer shape, 4
// sequences of 256 tokens a lane: a launch of 32 (sequence, kv head) pairs in 4 splits, 128 blocks
// of deep tiles, each holding an SM. When every such launch polled its lines itself, two waiting
// lanes held every SM of an H200, and the third lane's attention ran only once their waits gave up
// (a rotating cluster on two H200s stalled so). Under the lanes' budget (spin_budget.h) they wait
// behind a few blocks instead.
TEST(CudaKvLaneTest, LanesWaitingForRowsLeaveSmsToALaneWhoseRowsCame) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  namespace kc = kernels::cuda;
  ASSERT_TRUE(kc::PreloadDataPlaneKernels().ok());
  const kernels::cpu::AttentionShape shape{32, 8, 128, 0};
  const int64_t q = 4096, kv = 1024, row = q + 2 * kv;
  const int64_t seqs = 4, context = 256;
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int64_t blocks = kc::DecodeBlocks(shape, kc::PlanDecode(shape, seqs, context, sms), seqs);
  // Enough waiting lanes to fill every SM twice over, were their blocks all resident, then the fed one.
  const int64_t lanes = (2 * sms + blocks - 1) / blocks + 1;
  auto backend = CreateCudaKvBackend({1, lanes * seqs * context, shape}, 0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> qkv(seqs * row);
  for (float& x : qkv) x = dist(rng);
  DeviceBuffer source = Upload(qkv);
  auto sender = cuda::Stream::Create();
  ASSERT_TRUE(sender.ok());
  const QkvLayout layout{row, 0, q, q + kv};

  struct Lane {
    std::unique_ptr<DeviceKvLane> lane;
    DeviceBuffer lines, mirror, out, done, error;
  };
  std::vector<Lane> all(lanes);
  for (int64_t i = 0; i < lanes; ++i) {
    auto lane = (*backend)->NewDeviceLane(1);
    ASSERT_TRUE(lane.ok()) << lane.status();
    all[i].lane = std::move(*lane);
    all[i].lines = Upload(std::vector<kc::Line>(seqs * row / 2, kc::Line{}));
    all[i].mirror = Upload(std::vector<float>(seqs * row, 0.f));
    all[i].out = Upload(std::vector<float>(seqs * q, 0.f));
    all[i].done = Upload(std::vector<uint64_t>{0});
    all[i].error = Upload(std::vector<uint32_t>{0});
  }
  // Lane i's sequences hold slots of their own, each lane's the same keys and values; each
  // sequence writes its last.
  std::vector<float> cached(seqs * context * kv);
  for (float& x : cached) x = dist(rng);
  for (int64_t i = 0; i < lanes; ++i) {
    std::vector<int32_t> slots(seqs * context);
    std::iota(slots.begin(), slots.end(), static_cast<int32_t>(i * seqs * context));
    ASSERT_TRUE((*backend)->Store(0, slots, cached.data(), cached.data(), kv).ok());
  }
  const auto set_step = [&](int64_t i) {
    std::vector<int32_t> write_slots, slot_ids;
    std::vector<int64_t> begins = {0};
    for (int64_t s = 0; s < seqs; ++s) {
      const int32_t first = static_cast<int32_t>((i * seqs + s) * context);
      for (int32_t t = 0; t < context; ++t) slot_ids.push_back(first + t);
      write_slots.push_back(first + static_cast<int32_t>(context) - 1);
      begins.push_back(static_cast<int64_t>(slot_ids.size()));
    }
    return all[i].lane->SetStep(write_slots, slot_ids, begins, 1);
  };
  const auto queue = [&](int64_t i, uint64_t hop) {
    DeviceHop h = OutputHop(all[i].error.as<uint32_t>(), all[i].out.as<float>(), q, all[i].done.as<uint64_t>(), hop,
                            10'000'000'000);
    h.in = DeviceHop::LinesIn{all[i].lines.as<kc::Line>(), all[i].mirror.as<float>()};
    h.tag = kc::LineTag(hop);
    return all[i].lane->QueueLinkedChunk(0, 0, all[i].mirror.as<float>(), layout, h);
  };
  const auto send = [&](int64_t i, uint64_t hop) {
    return kc::SendLines(source.as<float>(), row, nullptr, seqs, row, all[i].lines.as<kc::Line>(), row,
                         kc::LineTag(hop), nullptr, sender->get());
  };

  // Hop 1, each lane's rows there before it is queued: loads every kernel the lanes launch while
  // nothing spins (CUDA's lazy loading waits for the GPU to go idle).
  for (int64_t i = 0; i < lanes; ++i) {
    ASSERT_TRUE(send(i, 1).ok());
    ASSERT_TRUE(sender->Synchronize().ok());
    ASSERT_TRUE(set_step(i).ok());
    ASSERT_TRUE(queue(i, 1).ok());
    ASSERT_TRUE(all[i].lane->Synchronize().ok());
    ASSERT_EQ(Download<uint32_t>(all[i].error.data(), 1)[0], 0u) << "lane " << i;
  }

  // Hop 2: every lane queued, only the last one's rows sent.
  for (int64_t i = 0; i < lanes; ++i) {
    ASSERT_TRUE(set_step(i).ok());
    ASSERT_TRUE(queue(i, 2).ok());
  }
  const int64_t fed = lanes - 1;
  ASSERT_TRUE(send(fed, 2).ok());
  ASSERT_TRUE(sender->Synchronize().ok());
  bool fed_done = false;
  for (int i = 0; i < 3000 && !fed_done; ++i) {
    fed_done = Peek<uint64_t>(all[fed].done.data(), 1)[0] == 2;
    if (!fed_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(fed_done) << lanes - 1 << " lanes waiting for rows (" << blocks << "-block launches on " << sms
                        << " SMs) kept the fed lane's attention off the GPU";
  for (int64_t i = 0; i < fed; ++i) {
    EXPECT_EQ(Peek<uint64_t>(all[i].done.data(), 1)[0], 1u) << "lane " << i << " ran before its rows came";
    ASSERT_TRUE(send(i, 2).ok());
  }
  ASSERT_TRUE(sender->Synchronize().ok());
  for (int64_t i = 0; i < lanes; ++i) {
    ASSERT_TRUE(all[i].lane->Synchronize().ok());
    EXPECT_EQ(Download<uint32_t>(all[i].error.data(), 1)[0], 0u) << "lane " << i;
    EXPECT_EQ(Download<uint64_t>(all[i].done.data(), 1)[0], 2u) << "lane " << i;
  }
  // The same outputs in every lane (the same rows over equal contexts), and those of the rows
  // attended unlinked.
  const std::vector<float> first = Download<float>(all[0].out.data(), seqs * q);
  for (int64_t i = 1; i < lanes; ++i) EXPECT_EQ(Download<float>(all[i].out.data(), seqs * q), first) << "lane " << i;
  ASSERT_TRUE(all[0].lane->QueueChunk(0, 0, source.as<float>(), layout).ok());
  ASSERT_TRUE(all[0].lane->Synchronize().ok());
  EXPECT_EQ(Download<float>(all[0].lane->step_out(), seqs * q), first);
}

// A step's chunk streams are made with the lane, before any wait spins: a step in several chunks
// then starts while another stream's wait spins on the GPU (a stream made then would wait for the
// spin to end: a memory node of rotation over two compute GPUs stalled so at 512 requests in
// flight), and a step in more chunks than the lane was made for is refused.
TEST(CudaKvLaneTest, AStepsChunkStreamsComeWithTheLaneSoAStepStartsWhileAWaitSpins) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  const kernels::cpu::AttentionShape shape{4, 2, 16, 0};
  auto backend = CreateCudaKvBackend({1, 64, shape}, 0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto lane = (*backend)->NewDeviceLane(4);
  ASSERT_TRUE(lane.ok()) << lane.status();
  EXPECT_FALSE((*backend)->NewDeviceLane(0).ok());

  auto spinning = cuda::Stream::Create();
  ASSERT_TRUE(spinning.ok()) << spinning.status();
  DeviceBuffer flag = Upload(std::vector<uint64_t>{0});
  DeviceBuffer error = Upload(std::vector<uint32_t>{0});
  ASSERT_TRUE(kernels::cuda::WaitFlag(flag.as<uint64_t>(), 1, 20'000'000'000, error.as<uint32_t>(), 1,
                                      spinning->get())
                  .ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the wait is spinning by now
  const auto start = std::chrono::steady_clock::now();
  const absl::Status four = (*lane)->SetStep({0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3, 4}, 4);
  const auto took = std::chrono::steady_clock::now() - start;
  const absl::Status five =
      (*lane)->SetStep({0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4, 5}, 5);
  const uint64_t raised = 1;
  ASSERT_EQ(cudaMemcpy(flag.as<uint64_t>(), &raised, sizeof(raised), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE(spinning->Synchronize().ok());
  EXPECT_EQ(Download<uint32_t>(error.data(), 1)[0], 0u) << "the wait gave up before the flag was raised";
  EXPECT_TRUE(four.ok()) << four;
  EXPECT_LT(took, std::chrono::seconds(2)) << "the step waited for the spinning wait";
  EXPECT_EQ(five.code(), absl::StatusCode::kInvalidArgument) << five;
  EXPECT_TRUE((*lane)->Synchronize().ok());
}

}  // namespace
}  // namespace lamina
