#include "compute_node/sampling/penalties.h"

#include <limits>
#include <vector>

#include "compute_node/sampling/sampler.h"
#include "gtest/gtest.h"

namespace lamina {
namespace {

// Prompt 5 7 5, then generated 7 9 9.
TokenHistory ExampleHistory() {
  TokenHistory history(3);
  const std::vector<int32_t> tokens = {5, 7, 5, 7, 9, 9};
  for (int32_t p = 0; p < static_cast<int32_t>(tokens.size()); ++p) history.Add(p, tokens[p]);
  return history;
}

TEST(TokenHistoryTest, CountsPromptAndGeneratedTokensOncePerPosition) {
  TokenHistory history = ExampleHistory();
  history.Add(4, 9);  // a step run again: counted already
  history.Add(2, 1);
  EXPECT_EQ(history.length(), 6);
  using Entry = TokenHistory::Entry;
  // One entry per distinct token, in the order first seen.
  EXPECT_EQ(history.entries(), (std::vector<Entry>{{5, 0, true}, {7, 1, true}, {9, 2, false}}));
  ASSERT_NE(history.Find(9), nullptr);
  EXPECT_EQ(history.Find(9)->generated, 2);
  EXPECT_EQ(history.Find(1), nullptr);
  history.Add(6, 1);
  ASSERT_NE(history.Find(1), nullptr);
  EXPECT_EQ(*history.Find(1), (Entry{1, 1, false}));
  EXPECT_EQ(history.length(), 7);
}

TEST(PenaltiesTest, EditsFollowTheDefinitionAndLeaveOtherTokens) {
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 3.0f, 1.0f, -1.0f, 1.0f, 4.0f, 1.0f};
  ApplyPenalties(params, ExampleHistory(), logits.data(), static_cast<int64_t>(logits.size()));
  // 5 (prompt): 3 / 2. 7 (prompt, generated once): -1 * 2 - (0.25 + 0.5). 9 (generated twice):
  // 4 / 2 - (0.5 + 0.5).
  const std::vector<float> want = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.5f, 1.0f, -2.75f, 1.0f, 1.0f, 1.0f};
  EXPECT_EQ(logits, want);
}

TEST(PenaltiesTest, EachPenaltyAloneTouchesOnlyItsTokens) {
  SamplingParams presence;
  presence.presence_penalty = -1.0f;  // negative: encourages repeats
  const std::vector<PenaltyEdit> edits = PenaltyEdits(presence, ExampleHistory());
  ASSERT_EQ(edits.size(), 2u);  // only generated tokens, in token order
  EXPECT_EQ(edits[0], (PenaltyEdit{7, 1.0f, -1.0f}));
  EXPECT_EQ(edits[1], (PenaltyEdit{9, 1.0f, -1.0f}));

  SamplingParams repetition;
  repetition.repetition_penalty = 0.5f;
  std::vector<float> logits(10, -3.0f);
  logits[5] = 2.0f;
  ApplyPenalties(repetition, ExampleHistory(), logits.data(), 10);
  EXPECT_EQ(logits[5], 4.0f);
  EXPECT_EQ(logits[7], -1.5f);
  EXPECT_EQ(logits[9], -1.5f);
  EXPECT_EQ(logits[6], -3.0f);
}

TEST(PenaltiesTest, NoPenaltiesNoEditsAndTokensOutsideTheVocabularyAreSkipped) {
  EXPECT_TRUE(PenaltyEdits(SamplingParams{}, ExampleHistory()).empty());
  SamplingParams params;
  params.frequency_penalty = 1.0f;
  std::vector<float> logits(8, 0.0f);  // token 9 is outside
  ApplyPenalties(params, ExampleHistory(), logits.data(), 8);
  EXPECT_EQ(logits[7], -1.0f);
  EXPECT_EQ(logits[5], 0.0f);  // prompt only: no frequency penalty
}

TEST(PenaltiesTest, APenaltyChangesTheGreedyToken) {
  SamplingParams params;
  params.presence_penalty = 2.0f;
  std::vector<float> logits(12, 0.0f);
  logits[9] = 3.0f;  // generated twice
  logits[4] = 1.5f;
  EXPECT_EQ(SampleToken(logits.data(), 12, params, 0), 9);  // SampleToken itself does not penalize
  ApplyPenalties(params, ExampleHistory(), logits.data(), 12);
  EXPECT_EQ(SampleToken(logits.data(), 12, params, 0), 4);
}

// ExampleHistory has 3 tokens generated: min_tokens 5 holds back its stop ids; 3 does not.
TEST(PenaltiesTest, MinTokensHoldsBackTheStopIdsUntilEnoughAreGenerated) {
  const float inf = std::numeric_limits<float>::infinity();
  SamplingParams params;
  params.min_tokens = 5;
  params.min_tokens_stop_ids = {9, 11, 11, 2};  // 9 is in the history, 11 twice
  ASSERT_TRUE(params.has_penalties());
  EXPECT_EQ(ExampleHistory().generated(), 3);
  // One edit per token: 9 (seen) in the history's order, then 11 and 2 once each.
  EXPECT_EQ(PenaltyEdits(params, ExampleHistory()),
            (std::vector<PenaltyEdit>{{9, 1.0f, inf}, {11, 1.0f, inf}, {2, 1.0f, inf}}));
  std::vector<float> logits(12, 0.5f);
  logits[11] = 9.0f;  // the most likely: held back, so the greedy token is another
  const std::vector<float> raw = logits;
  const std::vector<SavedLogit> saved = ApplyPenalties(params, ExampleHistory(), logits.data(), 12);
  EXPECT_EQ(logits[11], -inf);
  EXPECT_EQ(logits[9], -inf);
  EXPECT_NE(SampleToken(logits.data(), 12, params, 0), 11);
  RestoreLogits(saved, logits.data());
  EXPECT_EQ(logits, raw);

  // With penalties too, a held token's edit keeps its divisor and still rules it out.
  params.presence_penalty = 0.5f;
  params.repetition_penalty = 1.3f;
  EXPECT_EQ(PenaltyEdits(params, ExampleHistory())[2], (PenaltyEdit{9, 1.3f, inf}));
  // Enough generated: only the penalties remain.
  params.min_tokens = 3;
  for (const PenaltyEdit& e : PenaltyEdits(params, ExampleHistory())) EXPECT_NE(e.subtract, inf) << e.token;
  params.min_tokens = -1;
  EXPECT_EQ(params.Validate().message(), "min_tokens must be >= 0, got -1");
}

TEST(PenaltiesTest, ValidateNamesTheFieldOutOfRange) {
  SamplingParams params;
  params.repetition_penalty = 0.0f;
  EXPECT_EQ(params.Validate().message(), "repetition_penalty must be > 0, got 0");
  params.repetition_penalty = 1.2f;
  params.presence_penalty = 2.5f;
  EXPECT_EQ(params.Validate().message(), "presence_penalty must be from -2 to 2, got 2.5");
  params.presence_penalty = -2.0f;
  params.frequency_penalty = -3.0f;
  EXPECT_EQ(params.Validate().message(), "frequency_penalty must be from -2 to 2, got -3");
  params.frequency_penalty = 2.0f;
  EXPECT_TRUE(params.Validate().ok());
  EXPECT_TRUE(params.has_penalties());
  EXPECT_FALSE(SamplingParams{}.has_penalties());
}

}  // namespace
}  // namespace lamina
