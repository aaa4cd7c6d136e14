// The inputs of a linked decode launch (LinkedDecodeAttention, kernels/cuda/attention.h) and its
// reference, StoreKv + DecodeAttention, for the linked decode tests: one decode step over a pool
// with scattered slots, the plans to try, and the link around it. Skips without a GPU (the
// fixture's base).
#ifndef LAMINA_TESTS_UNIT_KERNELS_CUDA_LINKED_DECODE_FIXTURE_H_
#define LAMINA_TESTS_UNIT_KERNELS_CUDA_LINKED_DECODE_FIXTURE_H_

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/device_buffer.h"
#include "gtest/gtest.h"
#include "kernels/cuda/attention.h"
#include "tests/support/cuda_test_util.h"

namespace lamina::kernels::cuda::linked_decode_test {

using ::lamina::cuda::DeviceBuffer;
using ::lamina::testing::Download;
using ::lamina::testing::Upload;

inline std::vector<uint16_t> Bits(const std::vector<bf16>& v) {
  std::vector<uint16_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(bf16));
  return out;
}

struct Case {
  int64_t q_heads, kv_heads, head_dim;
  std::vector<int64_t> contexts;  // one per sequence, the new token included
  int64_t sliding_window = 0;
};

inline std::string Name(const Case& c, const DecodePlan& plan) {
  return "heads " + std::to_string(c.q_heads) + "/" + std::to_string(c.kv_heads) + " dim " +
         std::to_string(c.head_dim) + " splits " + std::to_string(plan.splits) + " " +
         DecodeStrategyName(plan.strategy) +
         (plan.pairs_per_block > 1 ? ", " + std::to_string(plan.pairs_per_block) + " pairs a block" : "");
}

// The warp-per-query-head plans of every width (DecodePlan::pairs_per_block), where they serve
// `shape`.
inline std::vector<DecodePlan> QueryHeadPlans(const AttentionShape& shape) {
  if (!QueryHeadWarpsServe(shape)) return {};
  std::vector<DecodePlan> plans;
  for (int width : {1, 2, kMostPairsPerBlock}) {
    DecodePlan plan;
    plan.strategy = DecodeStrategy::kWarpPerQueryHead;
    plan.pairs_per_block = width;
    plans.push_back(plan);
  }
  return plans;
}

// The planner's picks for a small and a large GPU, then a block (on the CUDA cores, tiled, tiled
// in 3 splits, the same with deep tiles) and a warp per (sequence, kv head) whatever the context,
// and a warp per query head of each width where it serves the shape.
inline std::vector<DecodePlan> Plans(const AttentionShape& shape, int64_t seqs, int64_t longest) {
  DecodePlan block_each, tiled_each, tiled_splits, warp_each;
  tiled_each.strategy = DecodeStrategy::kTiled;
  tiled_splits.strategy = DecodeStrategy::kTiled;
  tiled_splits.splits = 3;
  tiled_splits.workspace_floats = seqs * shape.num_q_heads * 3 * (shape.head_dim + 1);
  DecodePlan deep_each = tiled_each, deep_splits = tiled_splits;
  deep_each.strategy = deep_splits.strategy = DecodeStrategy::kDeepTiled;
  warp_each.strategy = DecodeStrategy::kWarpPerHead;
  std::vector<DecodePlan> plans = {PlanDecode(shape, seqs, longest, 1),
                                   PlanDecode(shape, seqs, longest, 132),
                                   block_each,
                                   tiled_each,
                                   tiled_splits,
                                   deep_each,
                                   deep_splits,
                                   warp_each};
  for (const DecodePlan& plan : QueryHeadPlans(shape)) plans.push_back(plan);
  return plans;
}

// One decode step's inputs: a pool with scattered slots, each sequence's last slot its write slot,
// and the q/k/v rows of the new tokens.
class LinkedDecodeTest : public ::lamina::testing::ErrorWordGpuTest {
 protected:
  void Build(const Case& c) {
    shape_ = {c.q_heads, c.kv_heads, c.head_dim, c.sliding_window};
    seqs_ = static_cast<int64_t>(c.contexts.size());
    kv_size_ = c.kv_heads * c.head_dim;
    q_size_ = c.q_heads * c.head_dim;
    row_ = q_size_ + 2 * kv_size_ + 8;  // a padded q/k/v row
    const int64_t total = std::accumulate(c.contexts.begin(), c.contexts.end(), int64_t{0});
    num_slots_ = total + 40;
    std::vector<int32_t> slots(num_slots_);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng_);
    slots.resize(total);
    std::vector<int32_t> begin = {0}, write;
    for (int64_t len : c.contexts) {
      begin.push_back(begin.back() + static_cast<int32_t>(len));
      write.push_back(slots[begin.back() - 1]);
    }
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    std::vector<bf16> pool(num_slots_ * kv_size_);
    for (bf16& x : pool) x = __float2bfloat16(dist(rng_));
    std::vector<float> qkv(seqs_ * row_);
    for (float& x : qkv) x = dist(rng_) * 2.f;
    pool_ = pool;
    d_qkv_ = Upload(qkv);
    d_slots_ = Upload(slots);
    d_begin_ = Upload(begin);
    d_write_ = Upload(write);
    longest_ = *std::max_element(c.contexts.begin(), c.contexts.end());
  }

  DecodeLink Link(const DeviceBuffer& ready, uint64_t ready_value, const DeviceBuffer& done, uint64_t done_value,
                  const DeviceBuffer& counters, int64_t timeout_ns = 5'000'000'000) {
    DecodeLink link;
    link.ready = ready.as<uint64_t>();
    link.ready_value = ready_value;
    link.timeout_ns = timeout_ns;
    link.error = error_.as<uint32_t>();
    link.error_code = 3;
    link.k = d_qkv_.as<float>() + q_size_;
    link.v = d_qkv_.as<float>() + q_size_ + kv_size_;
    link.kv_stride = row_;
    link.write_slots = d_write_.as<int32_t>();
    link.done = done.as<uint64_t>();
    link.done_value = done_value;
    link.counters = counters.as<uint32_t>();
    return link;
  }

  // StoreKv + DecodeAttention: the outputs and the pool afterwards.
  void Reference(const DecodePlan& plan, std::vector<float>* out, std::vector<uint16_t>* pool_k) {
    DeviceBuffer k = Upload(pool_), v = Upload(pool_);
    DeviceBuffer d_out = Upload(std::vector<float>(seqs_ * q_size_, 0.f));
    DeviceBuffer work = Upload(std::vector<float>(std::max<int64_t>(1, plan.workspace_floats)));
    const float* q = d_qkv_.as<float>();
    ASSERT_TRUE(StoreKv(q + q_size_, q + q_size_ + kv_size_, row_, d_write_.as<int32_t>(), k.as<bf16>(), v.as<bf16>(),
                        seqs_, kv_size_, nullptr).ok());
    ASSERT_TRUE(DecodeAttention(shape_, plan, q, row_, k.as<bf16>(), v.as<bf16>(), d_slots_.as<int32_t>(),
                                d_begin_.as<int32_t>(), d_out.as<float>(), q_size_, seqs_, work.as<float>(), nullptr)
                    .ok());
    *out = Download<float>(d_out, seqs_ * q_size_);
    *pool_k = Bits(Download<bf16>(k, pool_.size()));
  }

  std::mt19937 rng_{77};
  AttentionShape shape_;
  int64_t seqs_ = 0, kv_size_ = 0, q_size_ = 0, row_ = 0, num_slots_ = 0, longest_ = 0;
  std::vector<bf16> pool_;
  DeviceBuffer d_qkv_, d_slots_, d_begin_, d_write_;
};

// Plans a launch with lines takes (not a warp per head) whose grid stays within one wave, as it
// must while the sender is on the same GPU: one split, and four, on the CUDA cores, tiled and with
// deep tiles.
inline std::vector<DecodePlan> LinePlans(const AttentionShape& shape, int64_t seqs) {
  DecodePlan one, four;
  four.splits = 4;
  four.workspace_floats = seqs * shape.num_q_heads * four.splits * (shape.head_dim + 1);
  DecodePlan one_tiled = one, four_tiled = four;
  one_tiled.strategy = four_tiled.strategy = DecodeStrategy::kTiled;
  DecodePlan one_deep = one_tiled, four_deep = four_tiled;
  one_deep.strategy = four_deep.strategy = DecodeStrategy::kDeepTiled;
  return {one, four, one_tiled, four_tiled, one_deep, four_deep};
}

// The plans a packet hop goes with: LinePlans', a warp per (sequence, kv head) and a warp per
// query head of each width (where it serves the shape).
inline std::vector<DecodePlan> PacketPlans(const AttentionShape& shape, int64_t seqs) {
  std::vector<DecodePlan> plans = LinePlans(shape, seqs);
  DecodePlan warp_each;
  warp_each.strategy = DecodeStrategy::kWarpPerHead;
  plans.push_back(warp_each);
  for (const DecodePlan& plan : QueryHeadPlans(shape)) plans.push_back(plan);
  return plans;
}

}  // namespace lamina::kernels::cuda::linked_decode_test

#endif  // LAMINA_TESTS_UNIT_KERNELS_CUDA_LINKED_DECODE_FIXTURE_H_
