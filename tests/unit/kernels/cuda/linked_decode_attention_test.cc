// LinkedDecodeAttention (kernels/cuda/attention.h) against StoreKv + DecodeAttention, the path it
// replaces on a memory node: the same outputs and the same pool, bit for bit, with and without
// split contexts, and the hop around it: a wait queued ahead of rows that a SendRows on another
// stream delivers later, a done flag raised once, counters left zeroed, a wait that times out and
// keeps the done flag down; and the same with lines (line.h) in and out. Skips without a GPU.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/cuda/device_buffer.h"
#include "gtest/gtest.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/data_plane.h"
#include "tests/support/cuda_test_util.h"
#include "tests/unit/kernels/cuda/linked_decode_fixture.h"

namespace lamina::kernels::cuda {
namespace {

using ::lamina::cuda::DeviceBuffer;
using ::lamina::testing::Download;
using ::lamina::testing::Upload;
using linked_decode_test::Bits;
using linked_decode_test::Case;
using linked_decode_test::LinePlans;
using linked_decode_test::LinkedDecodeTest;
using linked_decode_test::Name;
using linked_decode_test::Plans;

TEST_F(LinkedDecodeTest, SameOutputsAndPoolAsStoreThenDecode) {
  const std::vector<Case> cases = {
      {32, 8, 128, {1, 2048, 33}},       // Llama-3 shape; a first token; a long context
      {8, 8, 64, {17, 300, 1}},          // MHA
      {8, 4, 32, {257, 1000, 3, 64}},    // the demo model's shape
      {12, 2, 64, {500, 129}, 100},      // sliding window
  };
  for (const Case& c : cases) {
    Build(c);
    for (const DecodePlan& plan : Plans(shape_, seqs_, longest_)) {
      std::vector<float> want;
      std::vector<uint16_t> want_k;
      Reference(plan, &want, &want_k);

      DeviceBuffer k = Upload(pool_), v = Upload(pool_);
      DeviceBuffer out = Upload(std::vector<float>(seqs_ * q_size_, 0.f));
      DeviceBuffer work = Upload(std::vector<float>(std::max<int64_t>(1, plan.workspace_floats)));
      DeviceBuffer ready = Upload(std::vector<uint64_t>{7});  // already past the value waited for
      DeviceBuffer done = Upload(std::vector<uint64_t>{0});
      const int64_t n_counters = LinkedDecodeCounters(shape_, seqs_);
      DeviceBuffer counters = Upload(std::vector<uint32_t>(n_counters, 0));
      const DecodeLink link = Link(ready, 5, done, 9, counters);
      ASSERT_TRUE(LinkedDecodeAttention(shape_, plan, d_qkv_.as<float>(), row_, k.as<bf16>(), v.as<bf16>(),
                                        d_slots_.as<int32_t>(), d_begin_.as<int32_t>(), out.as<float>(), q_size_,
                                        seqs_, work.as<float>(), link, nullptr)
                      .ok());
      EXPECT_EQ(Download<float>(out, want.size()), want) << Name(c, plan);
      EXPECT_EQ(Bits(Download<bf16>(k, pool_.size())), want_k) << Name(c, plan);
      EXPECT_EQ(Download<uint64_t>(done, 1)[0], 9u) << Name(c, plan);
      const std::vector<uint32_t> left = Download<uint32_t>(counters, n_counters);
      EXPECT_EQ(std::count(left.begin(), left.end(), 0u), n_counters) << "counters left zeroed: " << Name(c, plan);
      EXPECT_EQ(*error_.as<uint32_t>(), 0u);
    }
  }
}

TEST_F(LinkedDecodeTest, WaitsForRowsThatArriveLater) {
  Build({32, 8, 128, {40, 5}});
  for (const DecodePlan& plan : Plans(shape_, seqs_, longest_)) {
    SCOPED_TRACE(Name({32, 8, 128, {}}, plan));
    std::vector<float> want;
    std::vector<uint16_t> want_k;
    Reference(plan, &want, &want_k);

    // The launch reads a landing buffer that holds nothing yet; a sender on another stream fills it.
    DeviceBuffer source = std::move(d_qkv_);
    d_qkv_ = Upload(std::vector<float>(seqs_ * row_, 0.f));
    DeviceBuffer k = Upload(pool_), v = Upload(pool_);
    DeviceBuffer out = Upload(std::vector<float>(seqs_ * q_size_, 0.f));
    DeviceBuffer work = Upload(std::vector<float>(std::max<int64_t>(1, plan.workspace_floats)));
    DeviceBuffer ready = Upload(std::vector<uint64_t>{0});
    DeviceBuffer done = Upload(std::vector<uint64_t>{0});
    DeviceBuffer arrivals = Upload(std::vector<uint32_t>{0});
    DeviceBuffer counters = Upload(std::vector<uint32_t>(LinkedDecodeCounters(shape_, seqs_), 0));
    auto receiver = lamina::cuda::Stream::Create();
    auto sender = lamina::cuda::Stream::Create();
    ASSERT_TRUE(receiver.ok() && sender.ok());
    ASSERT_TRUE(LinkedDecodeAttention(shape_, plan, d_qkv_.as<float>(), row_, k.as<bf16>(), v.as<bf16>(),
                                      d_slots_.as<int32_t>(), d_begin_.as<int32_t>(), out.as<float>(), q_size_, seqs_,
                                      work.as<float>(), Link(ready, 1, done, 1, counters), receiver->get())
                    .ok());
    ASSERT_TRUE(SendRows(source.as<float>(), row_, nullptr, seqs_, row_, d_qkv_.as<float>(), row_,
                         ready.as<uint64_t>(), 1, nullptr, arrivals.as<uint32_t>(), sender->get())
                    .ok());
    ASSERT_TRUE(sender->Synchronize().ok());
    ASSERT_TRUE(receiver->Synchronize().ok());
    EXPECT_EQ(*error_.as<uint32_t>(), 0u);
    EXPECT_EQ(Download<float>(out, want.size()), want);
    EXPECT_EQ(Bits(Download<bf16>(k, pool_.size())), want_k);
    EXPECT_EQ(Download<uint64_t>(done, 1)[0], 1u);
  }
}

// The wait queued ahead of the launch, the launch chained to it (as a memory node queues a layer
// whose blocks do not fit its budget of waiting blocks): a WaitFlag before rows sent behind a flag,
// or a ReceiveLines before lines, the rows sent 20 ms after both were queued. The launch finds its
// inputs itself (its ready flag, or its lines, already there), or reads them after the wait's end
// (the rows the sender wrote, or those ReceiveLines put in place). Same outputs and pool as
// StoreKv + DecodeAttention, the done flag raised.
TEST_F(LinkedDecodeTest, ChainedToAWaitAheadTakesRowsThatArriveLater) {
  Build({32, 8, 128, {40, 5, 700}});
  const uint32_t tag = 12;
  for (const DecodePlan& plan : Plans(shape_, seqs_, longest_)) {
    for (const bool lines : {false, true}) {
      for (const bool finds_them : {true, false}) {
        // Lines go a block per (sequence, kv head).
        if (lines && finds_them && plan.by_warps()) continue;
        SCOPED_TRACE(Name({32, 8, 128, {}}, plan) + (lines ? ", lines" : ", flag") +
                     (finds_them ? ", found by the launch" : ", after the wait"));
        std::vector<float> want;
        std::vector<uint16_t> want_k;
        Reference(plan, &want, &want_k);

        DeviceBuffer source = std::move(d_qkv_);
        d_qkv_ = Upload(std::vector<float>(seqs_ * row_, 0.f));  // the landing rows, empty until sent
        DeviceBuffer in_lines = Upload(std::vector<Line>(seqs_ * row_ / 2, Line{}));
        DeviceBuffer k = Upload(pool_), v = Upload(pool_);
        DeviceBuffer out = Upload(std::vector<float>(seqs_ * q_size_, 0.f));
        DeviceBuffer work = Upload(std::vector<float>(std::max<int64_t>(1, plan.workspace_floats)));
        DeviceBuffer ready = Upload(std::vector<uint64_t>{0});
        DeviceBuffer done = Upload(std::vector<uint64_t>{0});
        DeviceBuffer arrivals = Upload(std::vector<uint32_t>{0});
        DeviceBuffer counters = Upload(std::vector<uint32_t>(LinkedDecodeCounters(shape_, seqs_), 0));
        auto receiver = lamina::cuda::Stream::Create();
        auto sender = lamina::cuda::Stream::Create();
        ASSERT_TRUE(receiver.ok() && sender.ok());
        DecodeLink link = Link(ready, 1, done, 1, counters);
        link.chained_to_wait = true;
        if (lines) {
          // Found by the launch: only waited for ahead; else put in place there.
          float* put = finds_them ? nullptr : d_qkv_.as<float>();
          ASSERT_TRUE(ReceiveLines(in_lines.as<Line>(), row_, tag, 5'000'000'000, error_.as<uint32_t>(), 3, nullptr,
                                   seqs_, row_, put, row_, receiver->get(), 0, NextKernel::kStartsOnceIn)
                          .ok());
          link.ready = nullptr;
          if (finds_them) {
            link.lines = in_lines.as<Line>();
            link.lines_mirror = d_qkv_.as<float>();
            link.line_tag = tag;
          }
        } else {
          ASSERT_TRUE(WaitFlag(ready.as<uint64_t>(), 1, 5'000'000'000, error_.as<uint32_t>(), 3, receiver->get()).ok());
          if (!finds_them) link.ready = nullptr;
        }
        ASSERT_TRUE(LinkedDecodeAttention(shape_, plan, d_qkv_.as<float>(), row_, k.as<bf16>(), v.as<bf16>(),
                                          d_slots_.as<int32_t>(), d_begin_.as<int32_t>(), out.as<float>(), q_size_,
                                          seqs_, work.as<float>(), link, receiver->get())
                        .ok());
        absl::SleepFor(absl::Milliseconds(20));
        if (lines) {
          ASSERT_TRUE(SendLines(source.as<float>(), row_, nullptr, seqs_, row_, in_lines.as<Line>(), row_, tag, nullptr,
                                sender->get())
                          .ok());
        } else {
          ASSERT_TRUE(SendRows(source.as<float>(), row_, nullptr, seqs_, row_, d_qkv_.as<float>(), row_,
                               ready.as<uint64_t>(), 1, nullptr, arrivals.as<uint32_t>(), sender->get())
                          .ok());
        }
        ASSERT_TRUE(sender->Synchronize().ok());
        ASSERT_TRUE(receiver->Synchronize().ok());
        d_qkv_ = std::move(source);
        EXPECT_EQ(*error_.as<uint32_t>(), 0u);
        EXPECT_EQ(Download<float>(out, want.size()), want);
        EXPECT_EQ(Bits(Download<bf16>(k, pool_.size())), want_k);
        EXPECT_EQ(Download<uint64_t>(done, 1)[0], 1u);
      }
    }
  }
}

TEST_F(LinkedDecodeTest, AWaitThatTimesOutKeepsTheDoneFlagDown) {
  Build({8, 4, 32, {100, 3}});
  for (const DecodePlan& plan : Plans(shape_, seqs_, longest_)) {
    *error_.as<uint32_t>() = 0;
    DeviceBuffer k = Upload(pool_), v = Upload(pool_);
    DeviceBuffer out = Upload(std::vector<float>(seqs_ * q_size_, 0.f));
    DeviceBuffer work = Upload(std::vector<float>(std::max<int64_t>(1, plan.workspace_floats)));
    DeviceBuffer ready = Upload(std::vector<uint64_t>{2});
    DeviceBuffer done = Upload(std::vector<uint64_t>{0});
    const int64_t n_counters = LinkedDecodeCounters(shape_, seqs_);
    DeviceBuffer counters = Upload(std::vector<uint32_t>(n_counters, 0));
    ASSERT_TRUE(LinkedDecodeAttention(shape_, plan, d_qkv_.as<float>(), row_, k.as<bf16>(), v.as<bf16>(),
                                      d_slots_.as<int32_t>(), d_begin_.as<int32_t>(), out.as<float>(), q_size_, seqs_,
                                      work.as<float>(), Link(ready, 3, done, 1, counters, 2'000'000), nullptr)
                    .ok());
    const std::string name = "splits " + std::to_string(plan.splits) + " " + DecodeStrategyName(plan.strategy);
    EXPECT_EQ(Download<uint64_t>(done, 1)[0], 0u) << name;
    EXPECT_EQ(*error_.as<uint32_t>(), 3u) << name;
    const std::vector<uint32_t> left = Download<uint32_t>(counters, n_counters);
    EXPECT_EQ(std::count(left.begin(), left.end(), 0u), n_counters) << name;
  }
}

TEST_F(LinkedDecodeTest, RefusesAnEmptyLaunchAndMissingLinkFields) {
  Build({8, 4, 32, {10}});
  const DecodePlan plan;
  DecodeLink link;
  absl::Status status = LinkedDecodeAttention(shape_, plan, nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr, 0,
                                              1, nullptr, link, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("required"), std::string::npos) << status;
  status = LinkedDecodeAttention(shape_, plan, nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 0, nullptr,
                                 link, nullptr);
  EXPECT_NE(status.message().find("no sequences"), std::string::npos) << status;
}

// q/k/v arrive as lines that a sender on another stream writes after the launch has begun to poll;
// the outputs leave as lines. Same outputs and pool as StoreKv + DecodeAttention, every output
// line tagged, the done flag raised.
TEST_F(LinkedDecodeTest, LinesInAndOutGiveTheSameOutputsAndPool) {
  const std::vector<Case> cases = {
      {32, 8, 128, {1, 2048, 33}},
      {8, 4, 32, {257, 3}},
  };
  const uint32_t tag = 41;
  for (const Case& c : cases) {
    Build(c);
    for (const DecodePlan& plan : LinePlans(shape_, seqs_)) {
      // With a done flag, and without one (the peer polls the lines): then the launch still counts
      // its busy time, and leaves its counters zeroed.
      for (const bool with_done : {true, false}) {
        SCOPED_TRACE(Name(c, plan) + (with_done ? ", done flag" : ", no done flag"));
        std::vector<float> want;
        std::vector<uint16_t> want_k;
        Reference(plan, &want, &want_k);

        DeviceBuffer source = std::move(d_qkv_);
        d_qkv_ = Upload(std::vector<float>(seqs_ * row_, 0.f));  // where the lines are put in place
        DeviceBuffer in_lines = Upload(std::vector<Line>(seqs_ * row_ / 2, Line{}));
        DeviceBuffer out_lines = Upload(std::vector<Line>(seqs_ * q_size_ / 2, Line{}));
        DeviceBuffer k = Upload(pool_), v = Upload(pool_);
        DeviceBuffer out = Upload(std::vector<float>(seqs_ * q_size_, -1.f));
        DeviceBuffer work = Upload(std::vector<float>(std::max<int64_t>(1, plan.workspace_floats)));
        DeviceBuffer unused_ready = Upload(std::vector<uint64_t>{0});
        DeviceBuffer done = Upload(std::vector<uint64_t>{0});
        const int64_t n_counters = LinkedDecodeCounters(shape_, seqs_);
        DeviceBuffer counters = Upload(std::vector<uint32_t>(n_counters, 0));
        DecodeLink link = Link(unused_ready, 1, done, 2, counters);
        link.ready = nullptr;
        link.lines = in_lines.as<Line>();
        link.lines_mirror = d_qkv_.as<float>();
        link.out_lines = out_lines.as<Line>();
        link.line_tag = tag;
        DeviceBuffer busy = Upload(std::vector<uint64_t>{0, 0, 0});  // busy_ns[2], busy_start
        if (!with_done) {
          link.done = nullptr;
          link.busy_ns = busy.as<uint64_t>();
          link.busy_start = busy.as<uint64_t>() + 2;
        }
        auto receiver = lamina::cuda::Stream::Create();
        auto sender = lamina::cuda::Stream::Create();
        ASSERT_TRUE(receiver.ok() && sender.ok());
        ASSERT_TRUE(LinkedDecodeAttention(shape_, plan, d_qkv_.as<float>(), row_, k.as<bf16>(), v.as<bf16>(),
                                          d_slots_.as<int32_t>(), d_begin_.as<int32_t>(), out.as<float>(), q_size_,
                                          seqs_, work.as<float>(), link, receiver->get())
                        .ok());
        absl::SleepFor(absl::Milliseconds(20));
        ASSERT_TRUE(SendLines(source.as<float>(), row_, nullptr, seqs_, row_, in_lines.as<Line>(), row_, tag, nullptr,
                              sender->get())
                        .ok());
        ASSERT_TRUE(sender->Synchronize().ok());
        ASSERT_TRUE(receiver->Synchronize().ok());
        d_qkv_ = std::move(source);

        EXPECT_EQ(*error_.as<uint32_t>(), 0u);
        std::vector<float> got;
        bool tagged = true;
        for (const Line& line : Download<Line>(out_lines, seqs_ * q_size_ / 2)) {
          tagged = tagged && line.first_tag == tag && line.second_tag == tag;
          got.push_back(line.first);
          got.push_back(line.second);
        }
        EXPECT_TRUE(tagged) << "every output line carries the hop's tag";
        EXPECT_EQ(got, want);
        EXPECT_EQ(Download<float>(out, 1)[0], -1.f) << "with output lines, out itself is not written";
        EXPECT_EQ(Bits(Download<bf16>(k, pool_.size())), want_k);
        EXPECT_EQ(Download<uint64_t>(done, 1)[0], with_done ? 2u : 0u);
        const std::vector<uint32_t> left = Download<uint32_t>(counters, n_counters);
        EXPECT_EQ(std::count(left.begin(), left.end(), 0u), n_counters) << "counters left zeroed";
        if (!with_done) {
          EXPECT_GT(Download<uint64_t>(busy, 1)[0], 0u) << "busy time counted";
        }
      }
    }
  }
}

// Lines that never come: the polls give up, no output line is written (the peer would take it for
// an answer) and the done flag stays down.
TEST_F(LinkedDecodeTest, LinesThatNeverComeLeaveNoOutputLines) {
  Build({8, 4, 32, {100, 3}});
  for (const DecodePlan& plan : LinePlans(shape_, seqs_)) {
    SCOPED_TRACE("splits " + std::to_string(plan.splits));
    *error_.as<uint32_t>() = 0;
    DeviceBuffer in_lines = Upload(std::vector<Line>(seqs_ * row_ / 2, Line{}));
    DeviceBuffer out_lines = Upload(std::vector<Line>(seqs_ * q_size_ / 2, Line{}));
    DeviceBuffer k = Upload(pool_), v = Upload(pool_);
    DeviceBuffer out = Upload(std::vector<float>(seqs_ * q_size_, 0.f));
    DeviceBuffer work = Upload(std::vector<float>(std::max<int64_t>(1, plan.workspace_floats)));
    DeviceBuffer unused_ready = Upload(std::vector<uint64_t>{0});
    DeviceBuffer done = Upload(std::vector<uint64_t>{0});
    DeviceBuffer counters = Upload(std::vector<uint32_t>(LinkedDecodeCounters(shape_, seqs_), 0));
    DecodeLink link = Link(unused_ready, 1, done, 1, counters, 2'000'000);
    link.ready = nullptr;
    link.lines = in_lines.as<Line>();
    link.lines_mirror = d_qkv_.as<float>();
    link.out_lines = out_lines.as<Line>();
    link.line_tag = 9;
    ASSERT_TRUE(LinkedDecodeAttention(shape_, plan, d_qkv_.as<float>(), row_, k.as<bf16>(), v.as<bf16>(),
                                      d_slots_.as<int32_t>(), d_begin_.as<int32_t>(), out.as<float>(), q_size_, seqs_,
                                      work.as<float>(), link, nullptr)
                    .ok());
    EXPECT_EQ(Download<uint64_t>(done, 1)[0], 0u);  // after the launch
    EXPECT_EQ(*error_.as<uint32_t>(), 3u);
    for (const Line& line : Download<Line>(out_lines, seqs_ * q_size_ / 2)) {
      ASSERT_EQ(line.first_tag, 0u);
      ASSERT_EQ(line.second_tag, 0u);
    }
  }
}

TEST_F(LinkedDecodeTest, LinesRefuseAWarpPerHeadPlanAndAReadyFlag) {
  Build({8, 4, 32, {10}});
  DeviceBuffer lines = Upload(std::vector<Line>(row_, Line{}));
  DeviceBuffer ready = Upload(std::vector<uint64_t>{0}), done = Upload(std::vector<uint64_t>{0});
  DeviceBuffer counters = Upload(std::vector<uint32_t>(LinkedDecodeCounters(shape_, seqs_), 0));
  DecodeLink link = Link(ready, 1, done, 1, counters);
  link.lines = lines.as<Line>();
  link.lines_mirror = d_qkv_.as<float>();
  DecodePlan warp_each;
  warp_each.strategy = DecodeStrategy::kWarpPerHead;
  DecodePlan block_each;
  for (const DecodePlan& plan : {warp_each, block_each}) {  // the block plan still has `ready` set
    const absl::Status status = LinkedDecodeAttention(shape_, plan, d_qkv_.as<float>(), row_, nullptr, nullptr,
                                                      nullptr, nullptr, nullptr, q_size_, seqs_, nullptr, link,
                                                      nullptr);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  }
}

}  // namespace
}  // namespace lamina::kernels::cuda
