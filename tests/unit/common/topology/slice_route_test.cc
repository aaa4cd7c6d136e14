#include "common/topology/slice_route.h"

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(SliceRouteTest, RotationRunsSliceKOfBatchJOnReplicaJPlusKModR) {
  const SliceRoute batch0{0, 0, 3, {}}, batch1{1, 0, 3, {}};
  EXPECT_EQ(batch0.OwnerOf(0), 0);
  EXPECT_EQ(batch0.OwnerOf(1), 1);
  EXPECT_EQ(batch0.OwnerOf(32), 2);  // 32 mod 3
  EXPECT_EQ(batch1.OwnerOf(32), 0);  // 33 mod 3
  EXPECT_TRUE(batch1.Owns(2));
  EXPECT_FALSE(batch1.Owns(0));
}

TEST(SliceRouteTest, ALayerSplitRunsEachSliceWhereTheLayerBeforeItLives) {
  // Layers [0, 3) on replica 0, [3, 8) on replica 1: slice k > 0 runs where layer k - 1 lives, so
  // replica 0 runs slices 0..3 (attention 0..3), replica 1 slices 4..8 (the last, with the head).
  for (int batch = 0; batch < 3; ++batch) {
    const SliceRoute route{batch, 1, 2, {0, 3}};
    for (int64_t slice = 0; slice <= 3; ++slice) EXPECT_EQ(route.OwnerOf(slice), 0) << slice;
    for (int64_t slice = 4; slice <= 8; ++slice) EXPECT_EQ(route.OwnerOf(slice), 1) << slice;
    EXPECT_TRUE(route.Owns(8));
  }
  const SliceRoute three{0, 2, 3, {0, 2, 5}};
  EXPECT_EQ(three.OwnerOf(2), 0);
  EXPECT_EQ(three.OwnerOf(3), 1);
  EXPECT_EQ(three.OwnerOf(5), 1);
  EXPECT_EQ(three.OwnerOf(6), 2);
}

}  // namespace
}  // namespace lamina
