// The log-probability kernel against its CPU reference (compute_node/sampling/logprobs.h) on the
// same logits: the same ids in the same order, values within float rounding of the final
// subtraction. Skips with the reason where no GPU is present.
#include "kernels/cuda/logprobs.h"

#include <cmath>
#include <random>
#include <vector>

#include "common/cuda/device.h"
#include "compute_node/sampling/logprobs.h"
#include "gtest/gtest.h"
#include "tests/support/cuda_test_util.h"

namespace lamina::kernels {
namespace {

using ::lamina::testing::Download;
using ::lamina::testing::Upload;

TEST(CudaLogprobsTest, EveryDrawEqualsTheCpuReferenceOnTheSameLogits) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "CUDA logprobs need a GPU: " << reason;
  // Odd and even vocabularies, Llama-3's among them; rows picked through the row index, with
  // repeats; draws that want nothing in between (their output must stay untouched).
  for (const int64_t vocab : {int64_t{5}, int64_t{1000}, int64_t{128256}, int64_t{151937}}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    const int64_t logit_rows = 4;
    std::mt19937 rng(static_cast<uint32_t>(vocab));
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> logits(logit_rows * vocab);
    for (float& v : logits) v = normal(rng);
    // Row 1: quarters, so that many tie; row 2: a few masked tokens and three tied largest.
    for (int64_t i = vocab; i < 2 * vocab; ++i) logits[i] = std::round(logits[i] * 4.0f) / 4.0f;
    float* row2 = logits.data() + 2 * vocab;
    row2[0] = row2[vocab / 2] = -INFINITY;
    row2[vocab - 1] = row2[vocab / 3] = row2[1] = 25.0f;

    const std::vector<int32_t> tops = {20, -1, 0, 1, 5, 20, 3, -1, 20};
    std::vector<int32_t> rows, tokens;
    for (size_t i = 0; i < tops.size(); ++i) {
      rows.push_back(static_cast<int32_t>((i * 3) % logit_rows));
      tokens.push_back(static_cast<int32_t>((i * 7919) % vocab));
    }
    cuda::DeviceTokenLogprobs untouched{};
    untouched.logprob = 42.0f;
    auto d_logits = Upload(logits), d_rows = Upload(rows), d_tokens = Upload(tokens), d_tops = Upload(tops);
    auto d_out = Upload(std::vector<cuda::DeviceTokenLogprobs>(tops.size(), untouched));
    ASSERT_TRUE(cuda::Logprobs(d_logits.as<float>(), d_rows.as<int32_t>(), d_tokens.as<int32_t>(), d_tops.as<int32_t>(),
                               d_out.as<cuda::DeviceTokenLogprobs>(), static_cast<int64_t>(tops.size()), vocab, nullptr)
                    .ok());
    const auto got = Download<cuda::DeviceTokenLogprobs>(d_out, tops.size());
    for (size_t i = 0; i < tops.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "draw " << i << " (row " << rows[i] << ", top " << tops[i] << ")");
      if (tops[i] < 0) {
        EXPECT_EQ(got[i].logprob, 42.0f);
        continue;
      }
      const TokenLogprobs want = ComputeLogprobs(logits.data() + rows[i] * vocab, vocab, tokens[i], tops[i]);
      if (std::isinf(want.logprob)) {
        EXPECT_EQ(got[i].logprob, want.logprob);
      } else {
        EXPECT_NEAR(got[i].logprob, want.logprob, 2e-6 * (1.0f + std::fabs(want.logprob)));
      }
      ASSERT_EQ(got[i].top_count, want.top_count);
      for (int32_t k = 0; k < want.top_count; ++k) {
        EXPECT_EQ(got[i].top_ids[k], want.top_ids[k]) << "rank " << k;
        if (std::isinf(want.top_logprobs[k])) {
          EXPECT_EQ(got[i].top_logprobs[k], want.top_logprobs[k]) << "rank " << k;
        } else {
          EXPECT_NEAR(got[i].top_logprobs[k], want.top_logprobs[k], 2e-6 * (1.0f + std::fabs(want.top_logprobs[k])))
              << "rank " << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace lamina::kernels
