// PrefillChunk: a prompt takes what the budget leaves, at most its rest, and the step's first
// prompt at least kMinPrefillChunk tokens even when nothing is left.
#include "coordinator/scheduler/prefill_chunk.h"

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(PrefillChunkTest, APromptTakesWhatTheBudgetLeavesUpToItsRest) {
  EXPECT_EQ(PrefillChunk(/*rest=*/100, /*left=*/48, /*first=*/true), 48);
  EXPECT_EQ(PrefillChunk(30, 48, true), 30);
  EXPECT_EQ(PrefillChunk(100, 48, false), 48);
  EXPECT_EQ(PrefillChunk(100, 0, false), 0) << "a later prompt waits when nothing is left";
  EXPECT_EQ(PrefillChunk(100, -20, false), 0) << "or when the budget is overdrawn";
}

TEST(PrefillChunkTest, TheFirstPromptAlwaysMoves) {
  EXPECT_EQ(PrefillChunk(100, 0, true), kMinPrefillChunk);
  EXPECT_EQ(PrefillChunk(100, -500, true), kMinPrefillChunk);
  EXPECT_EQ(PrefillChunk(5, -500, true), 5);
  EXPECT_EQ(PrefillChunk(100, kMinPrefillChunk + 1, true), kMinPrefillChunk + 1);
}

}  // namespace
}  // namespace lamina
