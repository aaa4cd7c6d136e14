// PrefillBudget: a step's prompts take what the budget leaves after its decodes, in order, each at
// most its rest, the first at least kMinPrefillChunk tokens; without chunking each takes its rest.
#include "coordinator/scheduler/prefill_budget.h"

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(PrefillBudgetTest, PromptsTakeWhatTheDecodesLeaveInOrder) {
  PrefillBudget prompts(/*budget=*/64, /*decodes=*/16, /*chunked=*/true);
  EXPECT_EQ(prompts.Take(30), 30);
  EXPECT_EQ(prompts.Take(100), 18);
  EXPECT_EQ(prompts.Take(100), 0) << "a later prompt waits when nothing is left";
}

TEST(PrefillBudgetTest, TheFirstPromptAlwaysMoves) {
  PrefillBudget overdrawn(/*budget=*/64, /*decodes=*/500, /*chunked=*/true);
  EXPECT_EQ(overdrawn.Take(100), kMinPrefillChunk);
  EXPECT_EQ(overdrawn.Take(100), 0);
  PrefillBudget short_first(64, 500, true);
  EXPECT_EQ(short_first.Take(5), 5);
  PrefillBudget roomy(64, 0, true);
  EXPECT_EQ(roomy.Take(100), 64);
}

TEST(PrefillBudgetTest, WithoutChunkingEachPromptTakesItsRest) {
  PrefillBudget prompts(64, 60, /*chunked=*/false);
  EXPECT_EQ(prompts.Take(300), 300);
  EXPECT_EQ(prompts.Take(200), 200);
}

}  // namespace
}  // namespace lamina
