// LinkWatch over real tcp connections: while armed it aborts the link of a connection whose peer
// closes, once, and leaves the others; disarmed it touches nothing. The links are test doubles that
// count their aborts (the real ones need two GPU processes: tests/integration/gpu_cluster_test).
#include "compute_node/remote/link_watch.h"

#include <atomic>
#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace lamina {
namespace {

class CountingLink : public ComputeLinkEnd {
 public:
  std::string transport() const override { return "counting"; }
  int max_chunks() const override { return 1; }
  std::string Offer() const override { return ""; }
  absl::Status Accept(const std::string&) override { return absl::OkStatus(); }
  absl::Status SetRows(absl::Span<const int32_t>) override { return absl::OkStatus(); }
  absl::Status QueueSend(uint64_t, int64_t, int, int, const float*, int64_t, GpuStream) override {
    return absl::OkStatus();
  }
  absl::Status QueueReceive(uint64_t, int64_t, int, int, float*, int64_t, GpuStream) override {
    return absl::OkStatus();
  }
  absl::Status TakeStepStatus() override { return absl::OkStatus(); }
  absl::Status Abort() override {
    ++aborts;
    return absl::OkStatus();
  }
  std::atomic<int> aborts{0};
};

// A tcp connection pair: `near` is watched, `far` plays the memory node.
struct Pair {
  std::unique_ptr<Connection> near, far;
};

class LinkWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transport_ = MakeTcpTransport();
    auto listener = transport_->Listen("127.0.0.1:0");
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = std::move(*listener);
  }

  Pair Connect() {
    Pair pair;
    std::thread accept([&] {
      auto far = listener_->Accept(absl::Now() + absl::Seconds(5));
      EXPECT_TRUE(far.ok()) << far.status();
      if (far.ok()) pair.far = std::move(*far);
    });
    auto near = transport_->Connect(listener_->address(), absl::Now() + absl::Seconds(5));
    accept.join();
    EXPECT_TRUE(near.ok()) << near.status();
    if (near.ok()) pair.near = std::move(*near);
    return pair;
  }

  // Waits up to 5 s for `link` to have been aborted once.
  static bool AwaitAbort(const CountingLink& link) {
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (link.aborts == 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
    return link.aborts == 1;
  }

  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Listener> listener_;
};

TEST_F(LinkWatchTest, ArmedItAbortsOnlyTheLinkWhosePeerClosedAndOnlyOnce) {
  Pair a = Connect(), b = Connect();
  ASSERT_TRUE(a.near && b.near);
  CountingLink link_a, link_b;
  LinkWatch watch(absl::Milliseconds(1));
  watch.Arm({{"memory-a", a.near.get(), &link_a}, {"memory-b", b.near.get(), &link_b}});
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(link_a.aborts, 0) << "no peer has closed yet";

  const absl::Time closed = absl::Now();
  a.far.reset();  // as when the memory node's process dies
  ASSERT_TRUE(AwaitAbort(link_a));
  EXPECT_LT(absl::Now() - closed, absl::Seconds(1));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(link_a.aborts, 1) << "a link is aborted once";
  EXPECT_EQ(link_b.aborts, 0);
  EXPECT_EQ(watch.aborted(), 1);
  watch.Disarm();
}

TEST_F(LinkWatchTest, DisarmedItLeavesTheLinksAloneUntilArmedAgain) {
  Pair a = Connect();
  ASSERT_TRUE(a.near);
  CountingLink link;
  LinkWatch watch(absl::Milliseconds(1));
  watch.Arm({{"memory-a", a.near.get(), &link}});
  watch.Disarm();
  a.far.reset();
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ(link.aborts, 0) << "between steps a close is the replies' to tell";
  // A step begun on a node that died in between is cut short as soon as the watch is armed.
  watch.Arm({{"memory-a", a.near.get(), &link}});
  EXPECT_TRUE(AwaitAbort(link));
  watch.Disarm();
}

}  // namespace
}  // namespace lamina
