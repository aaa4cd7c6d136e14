#include "common/threading/quiescent_release.h"

#include <atomic>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace lamina {
namespace {

// Counts its destruction in `*destroyed`.
struct Owner {
  explicit Owner(std::atomic<int>* destroyed) : destroyed(destroyed) {}
  ~Owner() { destroyed->fetch_add(1); }
  std::atomic<int>* destroyed;
};

TEST(QuiescentReleaseTest, WithNoStepRunningARetiredObjectIsDestroyedAtOnce) {
  QuiescentRelease release;
  std::atomic<int> destroyed{0};
  release.Retire(std::make_unique<Owner>(&destroyed));
  EXPECT_EQ(destroyed.load(), 1);
  EXPECT_EQ(release.retired_objects(), 0u);
  release.Retire(std::unique_ptr<Owner>());  // null: nothing to do
  EXPECT_EQ(release.retired_objects(), 0u);
}

TEST(QuiescentReleaseTest, ObjectsRetiredDuringStepsWaitForTheLastOfThemToEnd) {
  QuiescentRelease release;
  std::atomic<int> destroyed{0};
  release.BeginStep();
  release.BeginStep();
  release.Retire(std::make_unique<Owner>(&destroyed));
  release.Retire(std::make_unique<Owner>(&destroyed));
  EXPECT_EQ(destroyed.load(), 0);
  EXPECT_EQ(release.retired_objects(), 2u);
  release.EndStep();
  EXPECT_EQ(destroyed.load(), 0) << "a step still runs";
  EXPECT_EQ(release.running_steps(), 1);
  release.EndStep();
  EXPECT_EQ(destroyed.load(), 2);
  EXPECT_EQ(release.retired_objects(), 0u);
  EXPECT_EQ(release.running_steps(), 0);
}

// Blocks its destruction until `go` is notified, saying when it started.
struct SlowOwner {
  SlowOwner(absl::Notification* started, absl::Notification* go) : started(started), go(go) {}
  ~SlowOwner() {
    started->Notify();
    go->WaitForNotification();
  }
  absl::Notification* started;
  absl::Notification* go;
};

TEST(QuiescentReleaseTest, AStepBeginningWhileObjectsAreDestroyedWaitsForThem) {
  QuiescentRelease release;
  absl::Notification started, go, begun;
  std::thread destroyer([&] { release.Retire(std::make_unique<SlowOwner>(&started, &go)); });
  started.WaitForNotification();
  std::thread step([&] {
    ScopedDeviceStep scoped(&release);
    begun.Notify();
  });
  EXPECT_FALSE(begun.WaitForNotificationWithTimeout(absl::Milliseconds(100)))
      << "a step began while a retired object was being destroyed";
  go.Notify();
  EXPECT_TRUE(begun.WaitForNotificationWithTimeout(absl::Seconds(10)));
  destroyer.join();
  step.join();
  EXPECT_EQ(release.running_steps(), 0);
}

// Retires another object as it is destroyed, as an owner of owners may.
struct Nesting {
  Nesting(QuiescentRelease* release, std::atomic<int>* destroyed) : release(release), destroyed(destroyed) {}
  ~Nesting() { release->Retire(std::make_unique<Owner>(destroyed)); }
  QuiescentRelease* release;
  std::atomic<int>* destroyed;
};

TEST(QuiescentReleaseTest, WhatADestructorRetiresIsDestroyedInTheSameRelease) {
  QuiescentRelease release;
  std::atomic<int> destroyed{0};
  release.BeginStep();
  release.Retire(std::make_unique<Nesting>(&release, &destroyed));
  release.EndStep();
  EXPECT_EQ(destroyed.load(), 1);
  EXPECT_EQ(release.retired_objects(), 0u);
}

TEST(QuiescentReleaseTest, ManyThreadsSteppingAndRetiringLoseNothing) {
  QuiescentRelease release;
  std::atomic<int> destroyed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        ScopedDeviceStep scoped(&release);
        release.Retire(std::make_unique<Owner>(&destroyed));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(destroyed.load(), 2000);
  EXPECT_EQ(release.retired_objects(), 0u);
  EXPECT_EQ(release.running_steps(), 0);
}

}  // namespace
}  // namespace lamina
