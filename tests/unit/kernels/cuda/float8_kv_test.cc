// The float8 KV cache's CUDA kernels (kernels/cuda/attention.h's Float8KvLayer): StoreKv gives the
// CPU pool's codes and scales bit for bit (QuantizeFloat8E4M3); decode attention over a float8
// cache matches the CPU kernel over the same codes and scales (kernels/cpu/attention.h) under every
// kind of tiled plan; the linked launch gives StoreKv + DecodeAttention's outputs and pool bit for
// bit, with a ready flag and with lines in and out. Skips without a GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/cuda/device_buffer.h"
#include "common/tensor/float8.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/data_plane.h"
#include "kernels/cuda/packets.h"
#include "tests/support/cuda_test_util.h"

namespace lamina::kernels::cuda {
namespace {

using ::lamina::cuda::DeviceBuffer;
using ::lamina::testing::Download;
using ::lamina::testing::Upload;

// A float8 cache on the GPU, and what it holds.
struct DeviceFloat8Cache {
  DeviceBuffer k_codes, v_codes, k_scales, v_scales;

  static DeviceFloat8Cache Of(const std::vector<uint8_t>& k_codes, const std::vector<uint8_t>& v_codes,
                              const std::vector<float>& k_scales, const std::vector<float>& v_scales) {
    return {Upload(k_codes), Upload(v_codes), Upload(k_scales), Upload(v_scales)};
  }
  Float8KvLayer layer() const {
    return {k_codes.as<uint8_t>(), v_codes.as<uint8_t>(), k_scales.as<float>(), v_scales.as<float>()};
  }
  // Codes, then scales' bits: equal when the caches hold the same bits (NaN scales included).
  std::vector<uint32_t> Bits(size_t codes, size_t scales) const {
    std::vector<uint32_t> out;
    for (const DeviceBuffer* b : {&k_codes, &v_codes}) {
      for (uint8_t c : Download<uint8_t>(*b, codes)) out.push_back(c);
    }
    for (const DeviceBuffer* b : {&k_scales, &v_scales}) {
      for (float s : Download<float>(*b, scales)) {
        uint32_t bits;
        std::memcpy(&bits, &s, sizeof(bits));
        out.push_back(bits);
      }
    }
    return out;
  }
};

// A batch's contexts on scattered slots of a pool of `num_slots`, as after churn in the
// allocator: each sequence's slot list, where each begins (in both widths the kernels take), and
// each one's last slot, where its new token goes.
struct Contexts {
  std::vector<int32_t> slots, begin32, write;
  std::vector<int64_t> begin64;
};

Contexts ScatteredContexts(const std::vector<int64_t>& lengths, int64_t num_slots, std::mt19937& rng) {
  const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  Contexts c;
  c.slots.resize(num_slots);
  std::iota(c.slots.begin(), c.slots.end(), 0);
  std::shuffle(c.slots.begin(), c.slots.end(), rng);
  c.slots.resize(total);
  c.begin32 = {0};
  c.begin64 = {0};
  for (int64_t len : lengths) {
    c.begin64.push_back(c.begin64.back() + len);
    c.begin32.push_back(static_cast<int32_t>(c.begin64.back()));
    c.write.push_back(c.slots[c.begin64.back() - 1]);
  }
  return c;
}

class Float8KvTest : public ::lamina::testing::ErrorWordGpuTest {
 protected:
  // Values across many magnitudes: each head scaled by its own power of ten, so that a head's
  // small values land on subnormal codes.
  std::vector<float> Rows(int64_t count, int64_t stride, int64_t head_dim) {
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_int_distribution<int> exponent(-6, 4);
    std::vector<float> rows(count * stride);
    for (int64_t i = 0; i < count * stride; i += head_dim) {
      const float scale = std::pow(10.f, static_cast<float>(exponent(rng_)));
      for (int64_t d = i; d < std::min(count * stride, i + head_dim); ++d) {
        rows[d] = normal(rng_) * scale * (d % 7 == 0 ? 1e-3f : 1.f);
      }
    }
    return rows;
  }

  // A pool of `num_slots` slots quantized on the CPU from random rows: the codes and scales.
  void QuantizedPool(int64_t num_slots, int64_t kv_heads, int64_t head_dim, std::vector<uint8_t>* codes,
                     std::vector<float>* scales) {
    const std::vector<float> rows = Rows(num_slots, kv_heads * head_dim, head_dim);
    codes->resize(rows.size());
    scales->resize(num_slots * kv_heads);
    QuantizeFloat8E4M3(rows.data(), num_slots * kv_heads, head_dim, codes->data(), scales->data());
  }

  std::mt19937 rng_{808};
};

TEST_F(Float8KvTest, StoreKvQuantizesEachHeadAsTheCpuDoes) {
  for (const int64_t head_dim : {16, 32, 40, 64, 128}) {
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    const int64_t count = 9, kv_heads = 3, kv_size = kv_heads * head_dim, stride = 2 * kv_size + 5, num_slots = 30;
    std::vector<float> rows = Rows(count, stride, head_dim);
    // Row 0's first k head all zeros, its second below 2^-100; row 1's first holding a NaN, its
    // second an infinity; row 2's v heads past 448 (saturating codes).
    std::fill_n(rows.begin(), head_dim, 0.f);
    std::fill_n(rows.begin() + head_dim, head_dim, 1e-31f);
    rows[stride + 3] = std::numeric_limits<float>::quiet_NaN();
    rows[stride + head_dim + 1] = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < kv_size; ++i) rows[2 * stride + kv_size + i] *= 1e6f;
    const std::vector<int32_t> slots = {7, 3, 29, 0, 11, 12, 13, 20, 1};

    std::vector<uint8_t> k_codes(num_slots * kv_size, 0xAA), v_codes = k_codes;
    std::vector<float> k_scales(num_slots * kv_heads, -1.f), v_scales = k_scales;
    DeviceFloat8Cache cache = DeviceFloat8Cache::Of(k_codes, v_codes, k_scales, v_scales);
    DeviceBuffer d_rows = Upload(rows), d_slots = Upload(slots);
    ASSERT_TRUE(StoreKv(d_rows.as<float>(), d_rows.as<float>() + kv_size, stride, d_slots.as<int32_t>(), cache.layer(),
                        count, kv_heads, head_dim, nullptr)
                    .ok());
    for (int64_t r = 0; r < count; ++r) {
      const int64_t at = slots[r];
      QuantizeFloat8E4M3(&rows[r * stride], kv_heads, head_dim, &k_codes[at * kv_size], &k_scales[at * kv_heads]);
      QuantizeFloat8E4M3(&rows[r * stride + kv_size], kv_heads, head_dim, &v_codes[at * kv_size],
                         &v_scales[at * kv_heads]);
    }
    const DeviceFloat8Cache want = DeviceFloat8Cache::Of(k_codes, v_codes, k_scales, v_scales);
    EXPECT_EQ(cache.Bits(k_codes.size(), k_scales.size()), want.Bits(k_codes.size(), k_scales.size()));
    EXPECT_TRUE(std::isnan(Download<float>(cache.k_scales, k_scales.size())[slots[1] * kv_heads]));
    EXPECT_EQ(Download<float>(cache.k_scales, k_scales.size())[slots[0] * kv_heads + 1], 0.f);
  }
  const absl::Status wide = StoreKv(nullptr, nullptr, 0, nullptr, Float8KvLayer{}, 1, 1, 256, nullptr);
  EXPECT_EQ(wide.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wide.message(), "StoreKv into a float8 cache: head_dim 256 (supported: 1 to 128)");
}

struct Case {
  int64_t q_heads, kv_heads, head_dim;
  std::vector<int64_t> contexts;  // one per sequence, the new token included
  int64_t sliding_window = 0;
};

std::string Name(const Case& c, const DecodePlan& plan) {
  return "heads " + std::to_string(c.q_heads) + "/" + std::to_string(c.kv_heads) + " dim " +
         std::to_string(c.head_dim) + " splits " + std::to_string(plan.splits) + " " + DecodeStrategyName(plan.strategy);
}

// Tiled plans of each kind: the planner's for a small and a large GPU, and for a batch of short
// contexts that it plans a warp per head (Float8Plan makes them tiled); one block each, shallow and
// deep; 3 splits and the most a launch takes, shallow and deep.
std::vector<DecodePlan> Float8Plans(const AttentionShape& shape, int64_t seqs, int64_t longest) {
  DecodePlan tiled, three, most;
  tiled.strategy = three.strategy = most.strategy = DecodeStrategy::kTiled;
  three.splits = 3;
  most.splits = 1024;
  three.workspace_floats = seqs * shape.num_q_heads * three.splits * (shape.head_dim + 1);
  most.workspace_floats = seqs * shape.num_q_heads * most.splits * (shape.head_dim + 1);
  std::vector<DecodePlan> plans = {Float8Plan(PlanDecode(shape, seqs, longest, 1)),
                                   Float8Plan(PlanDecode(shape, seqs, longest, 132)),
                                   Float8Plan(PlanDecode(shape, seqs, 1, 1, 2, false)),
                                   tiled,
                                   three,
                                   most};
  for (DecodePlan plan : {tiled, three, most}) {
    plan.strategy = DecodeStrategy::kDeepTiled;
    plans.push_back(plan);
  }
  return plans;
}

TEST_F(Float8KvTest, DecodeAttentionMatchesTheCpuOverTheSameCodesAndScales) {
  const std::vector<Case> cases = {
      {8, 8, 64, {1, 17, 300}},           // MHA
      {32, 8, 128, {2048, 1, 4097, 33}},  // GQA, Llama-3 shape
      {8, 1, 128, {8192}},                // MQA, 8K
      {6, 6, 16, {5, 70}},                // the tiny model's shape
      {8, 4, 32, {257, 1000, 3}},         // the demo model's shape
      {12, 2, 64, {500, 129}, 100},       // 6 heads per KV head, sliding window
  };
  for (const Case& c : cases) {
    const AttentionShape shape{c.q_heads, c.kv_heads, c.head_dim, c.sliding_window};
    const int64_t seqs = static_cast<int64_t>(c.contexts.size());
    const int64_t total = std::accumulate(c.contexts.begin(), c.contexts.end(), int64_t{0});
    const int64_t num_slots = total + 50, kv_size = c.kv_heads * c.head_dim, q_size = c.q_heads * c.head_dim;
    const Contexts contexts = ScatteredContexts(c.contexts, num_slots, rng_);
    const std::vector<int32_t>& slots = contexts.slots;
    std::vector<uint8_t> k_codes, v_codes;
    std::vector<float> k_scales, v_scales;
    QuantizedPool(num_slots, c.kv_heads, c.head_dim, &k_codes, &k_scales);
    QuantizedPool(num_slots, c.kv_heads, c.head_dim, &v_codes, &v_scales);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    std::vector<float> q(seqs * q_size);
    for (float& x : q) x = dist(rng_) * 0.5f;
    std::vector<float> want(seqs * q_size);
    cpu::DecodeAttention(shape, q.data(), q_size, k_codes.data(), v_codes.data(), kv_size, k_scales.data(),
                         v_scales.data(), slots.data(), contexts.begin64.data(), want.data(), q_size, seqs);
    // The reference's own size, for the tolerance: outputs are weighted means of values.
    float largest = 0;
    for (float x : want) largest = std::max(largest, std::fabs(x));

    const DeviceFloat8Cache cache = DeviceFloat8Cache::Of(k_codes, v_codes, k_scales, v_scales);
    DeviceBuffer d_q = Upload(q), d_slots = Upload(slots), d_begin = Upload(contexts.begin32);
    const int64_t longest = *std::max_element(c.contexts.begin(), c.contexts.end());
    for (const DecodePlan& plan : Float8Plans(shape, seqs, longest)) {
      DeviceBuffer d_out = *DeviceBuffer::Create(want.size() * sizeof(float));
      DeviceBuffer d_work = *DeviceBuffer::Create(std::max<int64_t>(1, plan.workspace_floats) * sizeof(float));
      ASSERT_TRUE(DecodeAttention(shape, plan, d_q.as<float>(), q_size, cache.layer(), d_slots.as<int32_t>(),
                                  d_begin.as<int32_t>(), d_out.as<float>(), q_size, seqs, d_work.as<float>(), nullptr)
                      .ok())
          << Name(c, plan);
      const std::vector<float> got = Download<float>(d_out, want.size());
      float worst = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::fabs(got[i] - want[i]) / (2e-4f * largest + 2e-3f * std::fabs(want[i])));
      }
      EXPECT_LE(worst, 1.f) << Name(c, plan);
    }
  }
  DecodePlan warp_each;
  warp_each.strategy = DecodeStrategy::kWarpPerHead;
  const absl::Status untiled = DecodeAttention({8, 4, 32, 0}, warp_each, nullptr, 0, Float8KvLayer{}, nullptr, nullptr,
                                               nullptr, 0, 1, nullptr, nullptr);
  EXPECT_EQ(untiled.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(untiled.message(), "decode attention over a float8 cache: the plan must be tiled (Float8Plan)");
}

// One step of new tokens over a quantized pool: StoreKv + DecodeAttention (the reference), and the
// linked launch, with a ready flag already raised and with q/k/v as lines or packets that a sender
// writes once the launch polls (outputs as lines or packets then): the same outputs and pool, bit
// for bit.
TEST_F(Float8KvTest, LinkedLaunchEqualsStoreThenDecode) {
  const std::vector<Case> cases = {
      {32, 8, 128, {1, 2048, 33}},     // Llama-3 shape; a first token; a long context
      {8, 4, 32, {257, 1000, 3, 64}},  // the demo model's shape
      {12, 2, 64, {500, 129}, 100},    // sliding window
  };
  const uint32_t tag = 9;
  for (const Case& c : cases) {
    const AttentionShape shape{c.q_heads, c.kv_heads, c.head_dim, c.sliding_window};
    const int64_t seqs = static_cast<int64_t>(c.contexts.size());
    const int64_t total = std::accumulate(c.contexts.begin(), c.contexts.end(), int64_t{0});
    const int64_t num_slots = total + 40, kv_size = c.kv_heads * c.head_dim, q_size = c.q_heads * c.head_dim;
    const int64_t row = q_size + 2 * kv_size + 8;
    const Contexts contexts = ScatteredContexts(c.contexts, num_slots, rng_);
    std::vector<uint8_t> k_codes, v_codes;
    std::vector<float> k_scales, v_scales;
    QuantizedPool(num_slots, c.kv_heads, c.head_dim, &k_codes, &k_scales);
    QuantizedPool(num_slots, c.kv_heads, c.head_dim, &v_codes, &v_scales);
    const std::vector<float> qkv = Rows(seqs, row, c.head_dim);
    DeviceBuffer d_qkv = Upload(qkv), d_slots = Upload(contexts.slots), d_begin = Upload(contexts.begin32),
                 d_write = Upload(contexts.write);
    const int64_t longest = *std::max_element(c.contexts.begin(), c.contexts.end());
    for (const DecodePlan& plan : Float8Plans(shape, seqs, longest)) {
      if (plan.splits > 3) continue;  // the linked launch's splits are few
      SCOPED_TRACE(Name(c, plan));
      const float* q = d_qkv.as<float>();
      DeviceFloat8Cache reference = DeviceFloat8Cache::Of(k_codes, v_codes, k_scales, v_scales);
      DeviceBuffer want_out = Upload(std::vector<float>(seqs * q_size, 0.f));
      DeviceBuffer work = Upload(std::vector<float>(std::max<int64_t>(1, plan.workspace_floats)));
      ASSERT_TRUE(StoreKv(q + q_size, q + q_size + kv_size, row, d_write.as<int32_t>(), reference.layer(), seqs,
                          c.kv_heads, c.head_dim, nullptr)
                      .ok());
      ASSERT_TRUE(DecodeAttention(shape, plan, q, row, reference.layer(), d_slots.as<int32_t>(), d_begin.as<int32_t>(),
                                  want_out.as<float>(), q_size, seqs, work.as<float>(), nullptr)
                      .ok());
      const std::vector<float> want = Download<float>(want_out, seqs * q_size);
      const std::vector<uint32_t> want_pool = reference.Bits(k_codes.size(), k_scales.size());

      for (const std::string way : {"ready flag", "lines", "packets"}) {
        SCOPED_TRACE(way);
        const bool lines = way == "lines", packets = way == "packets";
        DeviceFloat8Cache cache = DeviceFloat8Cache::Of(k_codes, v_codes, k_scales, v_scales);
        DeviceBuffer mirror = Upload(lines || packets ? std::vector<float>(seqs * row, 0.f) : qkv);
        DeviceBuffer in_lines = Upload(std::vector<Line>(seqs * row / 2, Line{}));
        DeviceBuffer out_lines = Upload(std::vector<Line>(seqs * q_size / 2, Line{}));
        const int64_t out_per_row = PacketsPerRow(q_size, c.kv_heads);
        const int64_t part = q_size / c.kv_heads, per_part = PacketsPerRow(part);
        DeviceBuffer in_packets = Upload(std::vector<Packet>(seqs * PacketsPerRow(row), Packet{}));
        DeviceBuffer out_packets = Upload(std::vector<Packet>(seqs * out_per_row, Packet{}));
        DeviceBuffer out = Upload(std::vector<float>(seqs * q_size, -1.f));
        DeviceBuffer ready = Upload(std::vector<uint64_t>{7}), done = Upload(std::vector<uint64_t>{0});
        DeviceBuffer counters = Upload(std::vector<uint32_t>(LinkedDecodeCounters(shape, seqs), 0));
        DecodeLink link;
        link.ready = lines || packets ? nullptr : ready.as<uint64_t>();
        link.ready_value = 5;
        link.timeout_ns = 5'000'000'000;
        link.error = error_.as<uint32_t>();
        link.error_code = 3;
        link.k = mirror.as<float>() + q_size;
        link.v = mirror.as<float>() + q_size + kv_size;
        link.kv_stride = row;
        link.write_slots = d_write.as<int32_t>();
        link.done = done.as<uint64_t>();
        link.done_value = 2;
        link.counters = counters.as<uint32_t>();
        if (lines) {
          link.lines = in_lines.as<Line>();
          link.lines_mirror = mirror.as<float>();
          link.out_lines = out_lines.as<Line>();
          link.line_tag = tag;
        }
        if (packets) {
          link.packets = in_packets.as<Packet>();
          link.packets_mirror = mirror.as<float>();
          link.out_packets = out_packets.as<Packet>();
          link.line_tag = tag;
        }
        auto receiver = lamina::cuda::Stream::Create();
        auto sender = lamina::cuda::Stream::Create();
        ASSERT_TRUE(receiver.ok() && sender.ok());
        ASSERT_TRUE(LinkedDecodeAttention(shape, plan, mirror.as<float>(), row, cache.layer(), d_slots.as<int32_t>(),
                                          d_begin.as<int32_t>(), out.as<float>(), q_size, seqs, work.as<float>(), link,
                                          receiver->get())
                        .ok());
        if (lines) {
          absl::SleepFor(absl::Milliseconds(5));
          ASSERT_TRUE(SendLines(d_qkv.as<float>(), row, nullptr, seqs, row, in_lines.as<Line>(), row, tag, nullptr,
                                sender->get())
                          .ok());
        }
        if (packets) {
          absl::SleepFor(absl::Milliseconds(5));
          ASSERT_TRUE(SendPackets(d_qkv.as<float>(), row, nullptr, seqs, row, in_packets.as<Packet>(),
                                  PacketsPerRow(row), tag, nullptr, sender->get())
                          .ok());
        }
        ASSERT_TRUE(sender->Synchronize().ok());
        ASSERT_TRUE(receiver->Synchronize().ok());
        EXPECT_EQ(*error_.as<uint32_t>(), 0u);
        std::vector<float> got = Download<float>(out, seqs * q_size);
        if (lines) {
          got.clear();
          for (const Line& line : Download<Line>(out_lines, seqs * q_size / 2)) {
            got.push_back(line.first);
            got.push_back(line.second);
          }
        }
        if (packets) {  // row s's part h (kv head h's outputs) starts packet s * out_per_row + h * per_part
          const std::vector<Packet> sent = Download<Packet>(out_packets, seqs * out_per_row);
          for (int64_t s = 0; s < seqs; ++s) {
            for (int64_t i = 0; i < q_size; ++i) {
              const Packet& packet = sent[s * out_per_row + i / part * per_part + i % part / kPacketFloats];
              ASSERT_EQ(packet.tag, tag);
              got[s * q_size + i] = packet.values[i % part % kPacketFloats];
            }
          }
        }
        EXPECT_EQ(got, want);
        EXPECT_EQ(cache.Bits(k_codes.size(), k_scales.size()), want_pool);
        EXPECT_EQ(Download<uint64_t>(done, 1)[0], 2u);
      }
    }
  }
}

}  // namespace
}  // namespace lamina::kernels::cuda
