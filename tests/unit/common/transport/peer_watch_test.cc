// PeerWatch over real tcp connections: while armed it calls the abort of a connection whose peer
// closes, once, and leaves the others; disarmed it calls nothing. The aborts here count their calls
// (the real ones stop GPU waits: tests/integration/gpu_cluster_test kills nodes mid-step).
#include "common/transport/peer_watch.h"

#include <atomic>
#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace lamina {
namespace {

// A tcp connection pair: `near` is watched, `far` plays the peer.
struct Pair {
  std::unique_ptr<Connection> near, far;
};

class PeerWatchTest : public ::testing::Test {
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

  static PeerWatch::Watched Watch(const std::string& what, const Pair& pair, std::atomic<int>* aborts) {
    return {what, pair.near.get(), [aborts] {
              ++*aborts;
              return absl::OkStatus();
            }};
  }

  // Waits up to 5 s for `aborts` to reach 1; whether it is exactly 1 then.
  static bool AwaitAbort(const std::atomic<int>& aborts) {
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (aborts == 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
    return aborts == 1;
  }

  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Listener> listener_;
};

TEST_F(PeerWatchTest, ArmedItAbortsOnlyWhatWaitsOnThePeerThatClosedAndOnlyOnce) {
  Pair a = Connect(), b = Connect();
  ASSERT_TRUE(a.near && b.near);
  std::atomic<int> aborts_a{0}, aborts_b{0};
  PeerWatch watch(absl::Milliseconds(1));
  watch.Arm({Watch("peer a", a, &aborts_a), Watch("peer b", b, &aborts_b)});
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(aborts_a, 0) << "no peer has closed yet";

  const absl::Time closed = absl::Now();
  a.far.reset();  // as when the peer's process dies
  ASSERT_TRUE(AwaitAbort(aborts_a));
  EXPECT_LT(absl::Now() - closed, absl::Seconds(1));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(aborts_a, 1) << "an abort is called once";
  EXPECT_EQ(aborts_b, 0);
  EXPECT_EQ(watch.aborted(), 1);
  watch.Disarm();
}

TEST_F(PeerWatchTest, DisarmedItAbortsNothingUntilArmedAgain) {
  Pair a = Connect();
  ASSERT_TRUE(a.near);
  std::atomic<int> aborts{0};
  PeerWatch watch(absl::Milliseconds(1));
  watch.Arm({Watch("peer a", a, &aborts)});
  watch.Disarm();
  a.far.reset();
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ(aborts, 0) << "between steps a close is for the replies to tell";
  // A step begun with a peer that died in between is cut short as soon as the watch is armed.
  watch.Arm({Watch("peer a", a, &aborts)});
  EXPECT_TRUE(AwaitAbort(aborts));
  watch.Disarm();
}

}  // namespace
}  // namespace lamina
