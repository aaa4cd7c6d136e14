#include "compute_node/tensor_parallel/rank_group.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace lamina {
namespace {

// `size` ranks joined over one inproc transport, each on its own thread for `body`.
void WithGroup(int size, const std::string& address, const std::function<void(RankGroup&)>& body) {
  std::unique_ptr<Transport> transport = MakeInprocTransport();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto group = RankGroup::Join(transport.get(), r, size, address, absl::Seconds(5), absl::Now() + absl::Seconds(5));
      ASSERT_TRUE(group.ok()) << "rank " << r << ": " << group.status();
      body(**group);
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(RankGroupTest, SumsAndGathersAreTheSameBitsOnEveryRank) {
  WithGroup(3, "rank-group-sum", [](RankGroup& group) {
    const int r = group.rank();
    std::vector<float> data = {1.f + r, 0.1f * r, -2.f * r};
    ASSERT_TRUE(group.AllReduceSum(absl::MakeSpan(data)).ok());
    // Rank 0's part first, then 1, then 2.
    EXPECT_EQ(data, (std::vector<float>{(1.f + 2.f) + 3.f, (0.f + 0.1f) + 0.2f, (0.f + -2.f) + -4.f}));
    const std::vector<float> mine = {static_cast<float>(r), 10.f + r};
    std::vector<float> all(6);
    ASSERT_TRUE(group.AllGather(mine, absl::MakeSpan(all)).ok());
    EXPECT_EQ(all, (std::vector<float>{0, 10, 1, 11, 2, 12}));
  });
}

// A rank whose step fails abandons it: the others' calls of that step end at once (Aborted,
// well inside the 5 s timeout), whichever rank gave up, and the next step's sums are right: the
// parts a failed step left on the connections answer nothing later.
TEST(RankGroupTest, AnAbandonedStepEndsTheOthersCallsAtOnceAndTheNextStepIsRight) {
  WithGroup(3, "rank-group-abandon", [](RankGroup& group) {
    const int r = group.rank();
    for (int quitter : {1, 0, 2}) {
      const uint64_t failed_step = 10 + 2 * quitter;
      group.BeginStep(failed_step);
      std::vector<float> first = {1.f};
      ASSERT_TRUE(group.AllReduceSum(absl::MakeSpan(first)).ok());  // the step's first call goes through
      if (r == quitter) {
        group.AbandonStep();  // fails before its second call
      } else {
        std::vector<float> second = {2.f};
        const absl::Time start = absl::Now();
        const absl::Status status = group.AllReduceSum(absl::MakeSpan(second));
        EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << "rank " << r << ", quitter " << quitter << ": " << status;
        EXPECT_LT(absl::Now() - start, absl::Seconds(2));
        group.AbandonStep();  // as a failed step's rank does
      }
      group.BeginStep(failed_step + 1);
      std::vector<float> data = {1.f + r};
      ASSERT_TRUE(group.AllReduceSum(absl::MakeSpan(data)).ok()) << "rank " << r << ", quitter " << quitter;
      EXPECT_EQ(data[0], 6.f) << "rank " << r << ", quitter " << quitter;
    }
  });
}

TEST(RankGroupTest, ARankThatLeavesFailsTheOthersCallsInsteadOfHangingThem) {
  std::unique_ptr<Transport> transport = MakeInprocTransport();
  std::unique_ptr<RankGroup> leader;
  std::thread follower([&] {
    auto group = RankGroup::Join(transport.get(), 1, 2, "rank-group-leave", absl::Seconds(1),
                                 absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(group.ok()) << group.status();
    // Leaves (its connection closes) without taking part.
  });
  auto group = RankGroup::Join(transport.get(), 0, 2, "rank-group-leave", absl::Seconds(1),
                               absl::Now() + absl::Seconds(5));
  follower.join();
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<float> data = {1.f};
  const absl::Time start = absl::Now();
  const absl::Status status = (*group)->AllReduceSum(absl::MakeSpan(data));
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("tensor-parallel rank 1"), std::string::npos) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(RankGroupTest, RankZeroGivesUpWhenTheOthersNeverJoin) {
  std::unique_ptr<Transport> transport = MakeInprocTransport();
  auto group = RankGroup::Join(transport.get(), 0, 3, "rank-group-alone", absl::Seconds(1),
                               absl::Now() + absl::Milliseconds(200));
  ASSERT_FALSE(group.ok());
  EXPECT_NE(group.status().message().find("2 other ranks; 0 joined"), std::string::npos) << group.status();
}

}  // namespace
}  // namespace lamina
