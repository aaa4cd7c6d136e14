#include "kv/cache/kv_pool.h"

#include "gtest/gtest.h"

namespace lamina {
namespace {

// bfloat16 takes half of float32's bytes; float8 a quarter, plus a float scale per slot and kv
// head, kept in arrays of their own.
TEST(KvPoolTest, EachElementTypeTakesItsBytes) {
  const KvPoolShape shape{6, 100, 4, 32};
  EXPECT_EQ(KvPool<float>::BytesPerSlot(shape), 2 * 6 * 4 * 32 * 4);
  EXPECT_EQ(KvPool<uint16_t>::BytesPerSlot(shape), 2 * 6 * 4 * 32 * 2);
  EXPECT_EQ(KvPool<uint8_t>::BytesPerSlot(shape), 2 * 6 * (4 * 32 + 4 * 4));  // a float scale per kv head
  absl::StatusOr<KvPool<uint16_t>> pool = KvPool<uint16_t>::Create(shape);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->keys(5) + 100 * 4 * 32, &pool->keys(5)[100 * 4 * 32 - 1] + 1);
  EXPECT_EQ(KvPool<float>::Create({6, 0, 4, 32}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<KvPool<uint8_t>> float8 = KvPool<uint8_t>::Create(shape);
  ASSERT_TRUE(float8.ok()) << float8.status();
  float8->key_scales(5)[100 * 4 - 1] = 2.0f;  // the last slot's last head, in bounds
  float8->value_scales(0)[0] = 3.0f;
  EXPECT_NE(float8->key_scales(5), float8->value_scales(5));
}

// A pool past the machine's memory (a config.json claiming a billion layers made one) is refused
// with its size before anything is allocated, not left to the kernel's OOM killer.
TEST(KvPoolTest, APoolPastTheMachinesMemoryIsRefusedBeforeAllocating) {
  const absl::StatusOr<KvPool<float>> pool = KvPool<float>::Create({1000000000, 8192, 8, 128});
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted) << pool.status();
  EXPECT_NE(pool.status().message().find("a KV pool of 8192 slots and 1000000000 layers needs"), std::string::npos)
      << pool.status();
}

}  // namespace
}  // namespace lamina
