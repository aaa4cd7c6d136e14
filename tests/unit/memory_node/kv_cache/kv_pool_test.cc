#include "memory_node/kv_cache/kv_pool.h"

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(KvPoolTest, ABfloat16PoolTakesHalfTheBytesOfAFloat32One) {
  const KvPoolShape shape{6, 100, 4, 32};
  EXPECT_EQ(KvPool<float>::BytesPerSlot(shape), 2 * 6 * 4 * 32 * 4);
  EXPECT_EQ(KvPool<uint16_t>::BytesPerSlot(shape), 2 * 6 * 4 * 32 * 2);
  absl::StatusOr<KvPool<uint16_t>> pool = KvPool<uint16_t>::Create(shape);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->keys(5) + 100 * 4 * 32, &pool->keys(5)[100 * 4 * 32 - 1] + 1);
  EXPECT_EQ(KvPool<float>::Create({6, 0, 4, 32}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lamina
