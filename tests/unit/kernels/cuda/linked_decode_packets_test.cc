// LinkedDecodeAttention (kernels/cuda/attention.h) with its hop as packets (packets.h): q/k/v
// polled by each block from packets a sender writes after the launch has begun to poll (or after a
// WaitForFirstPacket queued ahead, the launch chained to it), the outputs written as packets in a
// part a kv head. Same outputs and pool as StoreKv + DecodeAttention, every output packet tagged;
// packets that never come leave no output packet; and the fields packets cannot go with are
// refused. Skips without a GPU.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/cuda/device_buffer.h"
#include "gtest/gtest.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/packets.h"
#include "tests/support/cuda_test_util.h"
#include "tests/unit/kernels/cuda/linked_decode_fixture.h"

namespace lamina::kernels::cuda {
namespace {

using ::lamina::cuda::DeviceBuffer;
using ::lamina::testing::Download;
using ::lamina::testing::Upload;
using linked_decode_test::Bits;
using linked_decode_test::Case;
using linked_decode_test::Name;
using linked_decode_test::PacketPlans;

class LinkedDecodePacketsTest : public linked_decode_test::LinkedDecodeTest {
 protected:
  // The output rows held by `packets` (rows of q_size_ floats in `parts` parts); false in *tagged
  // when any packet lacks `tag`.
  std::vector<float> Unpack(const DeviceBuffer& packets, int64_t parts, uint32_t tag, bool* tagged) {
    const int64_t part_floats = q_size_ / parts, per_part = PacketsPerRow(part_floats);
    const std::vector<Packet> all = Download<Packet>(packets, seqs_ * parts * per_part);
    std::vector<float> rows(seqs_ * q_size_);
    *tagged = true;
    for (int64_t s = 0; s < seqs_; ++s) {
      for (int64_t part = 0; part < parts; ++part) {
        for (int64_t j = 0; j < per_part; ++j) {
          const Packet& packet = all[(s * parts + part) * per_part + j];
          *tagged = *tagged && packet.tag == tag;
          for (int64_t f = 0; f < kPacketFloats && j * kPacketFloats + f < part_floats; ++f) {
            rows[s * q_size_ + part * part_floats + j * kPacketFloats + f] = packet.values[f];
          }
        }
      }
    }
    return rows;
  }

  DeviceBuffer OutPackets() {
    return Upload(std::vector<Packet>(seqs_ * PacketsPerRow(q_size_, shape_.num_kv_heads), Packet{}));
  }

  // Runs `plan` over the case Build made, with packets in and out, polled from the start or
  // `chained` behind a WaitForFirstPacket, and checks the outputs and pool against StoreKv +
  // DecodeAttention's, every output packet tagged `tag`. The packets are sent 20 ms after the
  // launch, or before it when `sent_first`.
  void ExpectPacketsInAndOut(const DecodePlan& plan, bool chained, uint32_t tag, bool sent_first = false) {
    std::vector<float> want;
    std::vector<uint16_t> want_k;
    Reference(plan, &want, &want_k);

    DeviceBuffer source = std::move(d_qkv_);
    d_qkv_ = Upload(std::vector<float>(seqs_ * row_, -3.f));  // what the packets mirror
    DeviceBuffer in_packets = Upload(std::vector<Packet>(seqs_ * PacketsPerRow(row_), Packet{}));
    DeviceBuffer out_packets = OutPackets();
    DeviceBuffer k = Upload(pool_), v = Upload(pool_);
    DeviceBuffer out = Upload(std::vector<float>(seqs_ * q_size_, -1.f));
    DeviceBuffer work = Upload(std::vector<float>(std::max<int64_t>(1, plan.workspace_floats)));
    DeviceBuffer unused = Upload(std::vector<uint64_t>{0});
    const int64_t n_counters = LinkedDecodeCounters(shape_, seqs_);
    DeviceBuffer counters = Upload(std::vector<uint32_t>(n_counters, 0));
    DeviceBuffer busy = Upload(std::vector<uint64_t>{0, 0, 0});  // busy_ns[2], busy_start
    DecodeLink link = Link(unused, 1, unused, 1, counters);
    link.ready = nullptr;
    link.done = nullptr;
    link.packets = in_packets.as<Packet>();
    link.packets_mirror = d_qkv_.as<float>();
    link.out_packets = out_packets.as<Packet>();
    link.line_tag = tag;
    link.busy_ns = busy.as<uint64_t>();
    link.busy_start = busy.as<uint64_t>() + 2;
    link.chained_to_wait = chained;
    auto receiver = lamina::cuda::Stream::Create();
    auto sender = lamina::cuda::Stream::Create();
    ASSERT_TRUE(receiver.ok() && sender.ok());
    const auto send = [&] {
      return SendPackets(source.as<float>(), row_, nullptr, seqs_, row_, in_packets.as<Packet>(), PacketsPerRow(row_),
                         tag, nullptr, sender->get());
    };
    if (sent_first) {
      ASSERT_TRUE(send().ok());
      ASSERT_TRUE(sender->Synchronize().ok());
    }
    if (chained) {
      ASSERT_TRUE(
          WaitForFirstPacket(in_packets.as<Packet>(), tag, 5'000'000'000, error_.as<uint32_t>(), 3, receiver->get())
              .ok());
    }
    ASSERT_TRUE(LinkedDecodeAttention(shape_, plan, d_qkv_.as<float>(), row_, k.as<bf16>(), v.as<bf16>(),
                                      d_slots_.as<int32_t>(), d_begin_.as<int32_t>(), out.as<float>(), q_size_,
                                      seqs_, work.as<float>(), link, receiver->get())
                    .ok());
    if (!sent_first) {
      absl::SleepFor(absl::Milliseconds(20));
      ASSERT_TRUE(send().ok());
      ASSERT_TRUE(sender->Synchronize().ok());
    }
    ASSERT_TRUE(receiver->Synchronize().ok());
    d_qkv_ = std::move(source);

    EXPECT_EQ(*error_.as<uint32_t>(), 0u);
    bool tagged = false;
    EXPECT_EQ(Unpack(out_packets, shape_.num_kv_heads, tag, &tagged), want);
    EXPECT_TRUE(tagged) << "every output packet carries the hop's tag";
    EXPECT_EQ(Download<float>(out, 1)[0], -1.f) << "with output packets, out itself is not written";
    EXPECT_EQ(Bits(Download<bf16>(k, pool_.size())), want_k);
    const std::vector<uint32_t> left = Download<uint32_t>(counters, n_counters);
    EXPECT_EQ(std::count(left.begin(), left.end(), 0u), n_counters) << "counters left zeroed";
    EXPECT_GT(Download<uint64_t>(busy, 1)[0], 0u) << "busy time counted";
  }
};

// The launch polls from the start, or starts once a WaitForFirstPacket queued ahead has seen the
// first packet (as a memory node queues a launch past its spin budget); with a split context its
// last split's block sends the merged outputs; with a warp per head each warp polls and sends.
TEST_F(LinkedDecodePacketsTest, PacketsInAndOutGiveTheSameOutputsAndPool) {
  const std::vector<Case> cases = {
      {32, 8, 128, {1, 2048, 33}},  // Llama-3's shape: 17 packets a kv head's outputs
      {8, 4, 32, {257, 3}},         // the demo model's: 3 packets, the last part-filled
      {12, 2, 64, {500, 129}, 100},  // a sliding window; 13 packets
      {4, 1, 128, {5, 17, 2}},       // 3 pairs: blocks of 2 or 4 pairs with some left idle
  };
  const uint32_t tag = 52;
  for (const Case& c : cases) {
    Build(c);
    for (const DecodePlan& plan : PacketPlans(shape_, seqs_)) {
      for (const bool chained : {false, true}) {
        SCOPED_TRACE(Name(c, plan) + (chained ? ", behind WaitForFirstPacket" : ", polled from the start"));
        ExpectPacketsInAndOut(plan, chained, tag);
      }
    }
  }
}

// A warp per query head loads its first turns of cached tokens before its polls where its blocks
// fit one wave of the kernel that does so, and not past that: 300 sequences of Llama-3's shape are
// 2,400 blocks, past a wave of any GPU of up to 132 SMs (16 blocks of 128 threads an SM at most),
// and 600 blocks of 4 pairs (4 of 512 threads an SM at most).
// Chained behind a WaitForFirstPacket: polling from the start, blocks past a wave on the sender's
// GPU would keep its kernel off the SMs (as a memory node sharing its GPU never queues them). The
// packets are sent before the launch: sent after it, once the wait has seen the first packet the
// launch's blocks may take every SM the send's blocks leave while the send still has blocks to
// place, and spin until the wait gives up (as it did on an H200).
TEST_F(LinkedDecodePacketsTest, AWarpPerQueryHeadPastOneWaveGivesTheSameOutputs) {
  Case c{32, 8, 128, {}};
  for (int s = 0; s < 300; ++s) c.contexts.push_back(1 + s % 20);
  Build(c);
  for (int width : {1, kMostPairsPerBlock}) {
    SCOPED_TRACE(std::to_string(width) + " pairs a block");
    DecodePlan plan;
    plan.strategy = DecodeStrategy::kWarpPerQueryHead;
    plan.pairs_per_block = width;
    ExpectPacketsInAndOut(plan, /*chained=*/true, 61, /*sent_first=*/true);
  }
}

// Inputs from rows already in place (no input packets), outputs as packets: what a launch chained
// behind a wait that put the rows in place sends.
TEST_F(LinkedDecodePacketsTest, OutputPacketsAloneGiveTheSameOutputs) {
  Build({32, 8, 128, {40, 5, 1}});
  for (const DecodePlan& plan : PacketPlans(shape_, seqs_)) {
    SCOPED_TRACE(Name({32, 8, 128, {}}, plan));
    std::vector<float> want;
    std::vector<uint16_t> want_k;
    Reference(plan, &want, &want_k);
    DeviceBuffer out_packets = OutPackets();
    DeviceBuffer k = Upload(pool_), v = Upload(pool_);
    DeviceBuffer work = Upload(std::vector<float>(std::max<int64_t>(1, plan.workspace_floats)));
    DeviceBuffer ready = Upload(std::vector<uint64_t>{4});
    DeviceBuffer done = Upload(std::vector<uint64_t>{0});
    DeviceBuffer counters = Upload(std::vector<uint32_t>(LinkedDecodeCounters(shape_, seqs_), 0));
    DecodeLink link = Link(ready, 4, done, 6, counters);
    link.out_packets = out_packets.as<Packet>();
    link.line_tag = 6;
    ASSERT_TRUE(LinkedDecodeAttention(shape_, plan, d_qkv_.as<float>(), row_, k.as<bf16>(), v.as<bf16>(),
                                      d_slots_.as<int32_t>(), d_begin_.as<int32_t>(), nullptr, q_size_, seqs_,
                                      work.as<float>(), link, nullptr)
                    .ok());
    bool tagged = false;
    EXPECT_EQ(Unpack(out_packets, shape_.num_kv_heads, 6, &tagged), want);
    EXPECT_TRUE(tagged);
    EXPECT_EQ(Bits(Download<bf16>(k, pool_.size())), want_k);
    EXPECT_EQ(Download<uint64_t>(done, 1)[0], 6u) << "the done flag is raised all the same";
  }
}

// Packets that never come: the polls give up, no output packet is written (the peer would take it
// for an answer), and the error word says so.
TEST_F(LinkedDecodePacketsTest, PacketsThatNeverComeLeaveNoOutputPackets) {
  Build({8, 4, 32, {100, 3}});
  for (const DecodePlan& plan : PacketPlans(shape_, seqs_)) {
    SCOPED_TRACE(Name({8, 4, 32, {}}, plan));
    *error_.as<uint32_t>() = 0;
    DeviceBuffer in_packets = Upload(std::vector<Packet>(seqs_ * PacketsPerRow(row_), Packet{}));
    DeviceBuffer out_packets = OutPackets();
    DeviceBuffer k = Upload(pool_), v = Upload(pool_);
    DeviceBuffer work = Upload(std::vector<float>(std::max<int64_t>(1, plan.workspace_floats)));
    DeviceBuffer unused = Upload(std::vector<uint64_t>{0});
    DeviceBuffer counters = Upload(std::vector<uint32_t>(LinkedDecodeCounters(shape_, seqs_), 0));
    DecodeLink link = Link(unused, 1, unused, 1, counters, 2'000'000);
    link.ready = nullptr;
    link.done = nullptr;
    link.packets = in_packets.as<Packet>();
    link.packets_mirror = d_qkv_.as<float>();
    link.out_packets = out_packets.as<Packet>();
    link.line_tag = 9;
    ASSERT_TRUE(LinkedDecodeAttention(shape_, plan, d_qkv_.as<float>(), row_, k.as<bf16>(), v.as<bf16>(),
                                      d_slots_.as<int32_t>(), d_begin_.as<int32_t>(), nullptr, q_size_, seqs_,
                                      work.as<float>(), link, nullptr)
                    .ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(*error_.as<uint32_t>(), 3u);
    for (const Packet& packet : Download<Packet>(out_packets, seqs_ * PacketsPerRow(q_size_, shape_.num_kv_heads))) {
      ASSERT_EQ(packet.tag, 0u);
    }
  }
}

TEST_F(LinkedDecodePacketsTest, PacketsRefuseLinesAFlagAndOtherRows) {
  Build({8, 4, 32, {10}});
  DeviceBuffer packets = OutPackets();
  DeviceBuffer lines = Upload(std::vector<Line>(row_, Line{}));
  DeviceBuffer flag = Upload(std::vector<uint64_t>{0});
  DeviceBuffer counters = Upload(std::vector<uint32_t>(LinkedDecodeCounters(shape_, seqs_), 0));
  DecodeLink base = Link(flag, 1, flag, 1, counters);
  base.ready = nullptr;
  base.packets = reinterpret_cast<const Packet*>(packets.data());
  base.packets_mirror = d_qkv_.as<float>();
  DecodeLink with_lines = base, with_ready = base, other_stride = base, outside = base;
  with_lines.out_lines = lines.as<Line>();
  with_ready.ready = flag.as<uint64_t>();
  other_stride.kv_stride = row_ + 2;
  outside.packets_mirror = d_qkv_.as<float>() + 1;  // q would lie before the mirrored rows
  const std::vector<std::pair<DecodePlan, DecodeLink>> refused = {
      {DecodePlan{}, with_lines}, {DecodePlan{}, with_ready},
      {DecodePlan{}, other_stride}, {DecodePlan{}, outside}};
  for (const auto& [plan, link] : refused) {
    const absl::Status status = LinkedDecodeAttention(shape_, plan, d_qkv_.as<float>(), row_, nullptr, nullptr,
                                                      nullptr, nullptr, nullptr, q_size_, seqs_, nullptr, link,
                                                      nullptr);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("packets"), std::string::npos) << status;
  }
}

}  // namespace
}  // namespace lamina::kernels::cuda
