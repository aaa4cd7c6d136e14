// A prefill's pieces for one memory node join the transfer before them while their rows follow it
// in the batch and it stays within the link's most rows.
#include "compute_node/remote/store_transfers.h"

#include <vector>

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(StoreTransfersTest, PiecesWhoseRowsFollowShareATransferUpToTheMostRows) {
  std::vector<BatchRows> transfers;
  EXPECT_EQ(AddToTransfers({0, 384}, 1000, &transfers), 0);
  EXPECT_EQ(AddToTransfers({384, 384}, 1000, &transfers), 0);  // follows: joins
  EXPECT_EQ(AddToTransfers({768, 384}, 1000, &transfers), 1);  // 1152 rows would be too many
  EXPECT_EQ(AddToTransfers({1152, 100}, 1000, &transfers), 1);
  EXPECT_EQ(AddToTransfers({1352, 10}, 1000, &transfers), 2);  // a gap (another node's prompt)
  EXPECT_EQ(AddToTransfers({1362, 1000}, 1000, &transfers), 3);
  ASSERT_EQ(transfers.size(), 4u);
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 768}, {768, 484}, {1352, 10}, {1362, 1000}};
  for (size_t t = 0; t < transfers.size(); ++t) {
    EXPECT_EQ(transfers[t].first_row, expected[t].first) << "transfer " << t;
    EXPECT_EQ(transfers[t].count, expected[t].second) << "transfer " << t;
  }
}

TEST(StoreTransfersTest, APieceThatFillsTheMostRowsStandsAlone) {
  std::vector<BatchRows> transfers;
  EXPECT_EQ(AddToTransfers({0, 8}, 8, &transfers), 0);
  EXPECT_EQ(AddToTransfers({8, 8}, 8, &transfers), 1);
  EXPECT_EQ(AddToTransfers({16, 1}, 8, &transfers), 2);
  EXPECT_EQ(transfers.size(), 3u);
}

}  // namespace
}  // namespace lamina
