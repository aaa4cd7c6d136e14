#include "kv/cache/slot_allocator.h"

#include <vector>

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(SlotAllocatorTest, FreshPoolHandsOutAscendingRuns) {
  SlotAllocator allocator(8);
  std::vector<SlotId> slots;
  ASSERT_TRUE(allocator.Allocate(3, &slots).ok());
  EXPECT_EQ(slots, (std::vector<SlotId>{0, 1, 2}));
  EXPECT_EQ(allocator.num_free(), 5);
}

TEST(SlotAllocatorTest, FreedSlotsAreReusedFirstInTheirOrder) {
  SlotAllocator allocator(8);
  std::vector<SlotId> a, b, c;
  ASSERT_TRUE(allocator.Allocate(3, &a).ok());
  ASSERT_TRUE(allocator.Allocate(2, &b).ok());
  allocator.Release(a);
  ASSERT_TRUE(allocator.Allocate(3, &c).ok());
  EXPECT_EQ(c, a);
}

TEST(SlotAllocatorTest, ExhaustionIsResourceExhaustedAndTakesNothing) {
  SlotAllocator allocator(4);
  std::vector<SlotId> slots;
  ASSERT_TRUE(allocator.Allocate(3, &slots).ok());
  absl::Status status = allocator.Allocate(2, &slots);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(slots.size(), 3u);
  EXPECT_EQ(allocator.num_free(), 1);
}

TEST(SlotAllocatorTest, SharedSlotsFreeOnlyWhenTheLastReferenceGoes) {
  SlotAllocator allocator(4);
  std::vector<SlotId> a;
  ASSERT_TRUE(allocator.Allocate(2, &a).ok());
  allocator.Share(a);
  EXPECT_EQ(allocator.num_shared(), 2);
  EXPECT_EQ(allocator.RefCount(a[0]), 2);
  allocator.Release(a);
  EXPECT_EQ(allocator.num_free(), 2);
  EXPECT_EQ(allocator.num_shared(), 0);
  allocator.Release(a);
  EXPECT_EQ(allocator.num_free(), 4);
  EXPECT_EQ(allocator.RefCount(a[1]), 0);
}

}  // namespace
}  // namespace lamina
