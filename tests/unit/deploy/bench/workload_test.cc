#include "deploy/bench/workload.h"

#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace lamina::bench {
namespace {

TEST(WorkloadTest, FixedLengthsAreClippedToTheContext) {
  WorkloadSpec spec;
  spec.requests = 5;
  spec.prompt_tokens = 100;
  spec.output_tokens = 30;
  absl::StatusOr<std::vector<BenchRequest>> requests = MakeRequests(spec, 50, 64);
  ASSERT_TRUE(requests.ok()) << requests.status();
  ASSERT_EQ(requests->size(), 5u);
  for (const BenchRequest& r : *requests) {
    EXPECT_EQ(r.output_tokens, 30);
    EXPECT_EQ(r.prompt_ids.size(), 34u);  // 64 - 30
    for (int32_t id : r.prompt_ids) EXPECT_TRUE(id >= 0 && id < 50);
  }
}

TEST(WorkloadTest, SameSeedSameRequests) {
  WorkloadSpec spec;
  spec.mode = ArrivalMode::kOpenLoop;
  spec.rate = 10;
  spec.lengths = LAMINA_SOURCE_DIR "/deploy/workloads/sharegpt-like.yaml";
  spec.requests = 2000;
  auto a = MakeRequests(spec, 1000, 1 << 20);
  auto b = MakeRequests(spec, 1000, 1 << 20);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok());
  double prompt = 0, output = 0;
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].prompt_ids, (*b)[i].prompt_ids);
    prompt += (*a)[i].prompt_ids.size();
    output += (*a)[i].output_tokens;
  }
  // The distribution's binned means are about 174 and 364 tokens; arrivals are 10/s on average.
  EXPECT_NEAR(prompt / a->size(), 174, 25);
  EXPECT_NEAR(output / a->size(), 364, 30);
  EXPECT_NEAR(a->back().arrival_s / a->size(), 0.1, 0.01);
}

TEST(WorkloadTest, FileErrorsNameFileLineAndField) {
  testing::TempDir dir;
  absl::Status status = LoadWorkload(dir.Write("w.yaml", "requests: 4\nmode: sideways\n")).status();
  EXPECT_NE(status.message().find("w.yaml:2: mode"), std::string::npos) << status;
  status = LoadWorkload(dir.Write("w2.yaml", "mode: open\n")).status();
  EXPECT_NE(status.message().find("rate"), std::string::npos) << status;
  status = LoadLengthDistribution(dir.Write("l.yaml", "prompt_tokens: [[5, 1, 1]]\noutput_tokens: [[1, 2, 1]]\n")).status();
  EXPECT_NE(status.message().find("l.yaml:1: prompt_tokens[0]"), std::string::npos) << status;
}

TEST(WorkloadTest, PromptsFileIsReadLineByLine) {
  testing::TempDir dir;
  WorkloadSpec spec;
  spec.requests = 3;
  spec.prompts = dir.Write("p.txt", "first\n\nsecond\n");
  auto requests = MakeRequests(spec, 10, 100);
  ASSERT_TRUE(requests.ok()) << requests.status();
  EXPECT_EQ((*requests)[0].prompt_text, "first");
  EXPECT_EQ((*requests)[1].prompt_text, "second");
  EXPECT_EQ((*requests)[2].prompt_text, "first");
}

}  // namespace
}  // namespace lamina::bench
