// The penalty kernel against its CPU reference (compute_node/sampling/penalties.h) on the same
// logits: every edited logit equal bit for bit, the others untouched, and RestoreLogits giving back
// the raw row. Skips with the reason where no GPU is present.
#include "kernels/cuda/penalties.h"

#include <cstring>
#include <random>
#include <vector>

#include "common/cuda/device.h"
#include "compute_node/sampling/penalties.h"
#include "gtest/gtest.h"
#include "tests/support/cuda_test_util.h"

namespace lamina::kernels {
namespace {

using ::lamina::testing::Download;
using ::lamina::testing::Upload;

TEST(CudaPenaltiesTest, EditsEqualTheCpuReferenceBitForBitAndRestoreGivesTheRawLogitsBack) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "CUDA penalties need a GPU: " << reason;
  const int64_t vocab = 128256;
  const int64_t rows = 3;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(rows * vocab);
  for (float& v : logits) v = normal(rng);
  logits[5] = -INFINITY;  // a masked token stays masked
  logits[6] = 0.0f;

  // Row 0: a long history with every penalty; row 1: untouched; row 2: repetition below 1.
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab) - 1);
  TokenHistory long_history(300);
  for (int32_t p = 0; p < 700; ++p) long_history.Add(p, p < 4 ? p + 4 : token(rng) % 2000);
  TokenHistory short_history(2);
  for (int32_t p = 0; p < 5; ++p) short_history.Add(p, static_cast<int32_t>(vocab) - 1 - p);
  SamplingParams all, below_one;
  all.repetition_penalty = 1.7f;
  all.presence_penalty = 0.3f;
  all.frequency_penalty = -0.45f;
  below_one.repetition_penalty = 0.6f;
  below_one.min_tokens = 10;  // 3 generated: these cannot be drawn (edits to -infinity)
  below_one.min_tokens_stop_ids = {static_cast<int32_t>(vocab) - 1, 17, 17};
  const SamplingParams row_params[] = {all, SamplingParams{}, below_one};
  const TokenHistory* row_history[] = {&long_history, &long_history, &short_history};
  std::vector<std::vector<PenaltyEdit>> edits;
  for (int r = 0; r < rows; ++r) edits.push_back(PenaltyEdits(row_params[r], *row_history[r]));
  ASSERT_GT(edits[0].size(), 500u);

  std::vector<cuda::DevicePenaltyEdit> device_edits;
  std::vector<float> want = logits;
  for (int32_t r = 0; r < rows; ++r) {
    ApplyPenalties(row_params[r], *row_history[r], want.data() + r * vocab, vocab);
    for (const PenaltyEdit& e : edits[r]) device_edits.push_back({r, e.token, e.divisor, e.subtract});
  }
  const int64_t count = static_cast<int64_t>(device_edits.size());
  auto d_logits = Upload(logits), d_edits = Upload(device_edits);
  auto d_saved = Upload(std::vector<float>(count, 0.0f));
  ASSERT_TRUE(cuda::ApplyPenalties(d_logits.as<float>(), d_edits.as<cuda::DevicePenaltyEdit>(), d_saved.as<float>(),
                                   count, vocab, nullptr)
                  .ok());
  const std::vector<float> got = Download<float>(d_logits, logits.size());
  int64_t changed = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
        << "row " << i / vocab << ", token " << i % vocab << ": " << got[i] << " vs " << want[i];
    changed += got[i] != logits[i] ? 1 : 0;
  }
  EXPECT_GT(changed, 500);

  ASSERT_TRUE(cuda::RestoreLogits(d_logits.as<float>(), d_edits.as<cuda::DevicePenaltyEdit>(), d_saved.as<float>(),
                                  count, vocab, nullptr)
                  .ok());
  const std::vector<float> restored = Download<float>(d_logits, logits.size());
  EXPECT_EQ(std::memcmp(restored.data(), logits.data(), logits.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace lamina::kernels
