// The device links' front door (data_plane/device_link.h): names that are no device-side transport
// refused by both ends, and how a layer's rows split into chunks (ChunksFor's count and
// ChunkOf's ranges, which cover every row once).
#include "data_plane/device_link.h"

#include <string>

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(DeviceLinkFactoryTest, ANameThatIsNoDeviceTransportIsRefusedByBothEnds) {
  const LinkShape shape;
  for (const char* name : {"tcp", "inproc", "", "CUDA_IPC"}) {
    const auto compute = CreateComputeLinkEnd(name, shape, 0);
    EXPECT_EQ(compute.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(compute.status().message(), std::string("'") + name + "' is not a device-side transport");
    const auto memory = CreateMemoryLinkEnd(name, shape, 0, "");
    EXPECT_EQ(memory.status().code(), absl::StatusCode::kInvalidArgument) << name;
  }
}

TEST(ChunksForTest, ChunksOfAtLeastChunkRowsUpToTheMost) {
  EXPECT_EQ(ChunksFor(1, 4, 128), 1);
  EXPECT_EQ(ChunksFor(255, 4, 128), 1);
  EXPECT_EQ(ChunksFor(256, 4, 128), 2);
  EXPECT_EQ(ChunksFor(384, 4, 128), 3);
  EXPECT_EQ(ChunksFor(1024, 4, 128), 4);
  EXPECT_EQ(ChunksFor(1024, 2, 128), 2) << "the link's most";
  EXPECT_EQ(ChunksFor(1024, 4, 0), 1) << "chunk_rows 0: one chunk";
  EXPECT_EQ(ChunksFor(16, 4, 4), 4);
  EXPECT_EQ(ChunksFor(0, 4, 4), 1);
}

TEST(ChunkOfTest, ChunksCoverEveryRowOnceInOrder) {
  for (int64_t rows : {1, 5, 16, 257, 1024}) {
    for (int chunks = 1; chunks <= 4; ++chunks) {
      int64_t next = 0;
      for (int c = 0; c < chunks; ++c) {
        const RowRange r = ChunkOf(rows, chunks, c);
        EXPECT_EQ(r.first, next) << rows << " rows, chunk " << c << " of " << chunks;
        EXPECT_LE(r.count, rows / chunks + 1);
        EXPECT_GE(r.count, rows / chunks);
        next += r.count;
      }
      EXPECT_EQ(next, rows) << rows << " rows in " << chunks;
    }
  }
}

}  // namespace
}  // namespace lamina
