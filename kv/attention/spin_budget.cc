#include "kv/attention/spin_budget.h"

#include <algorithm>

namespace lamina {

std::unique_ptr<SpinBudget> SpinBudget::ForSms(int64_t sms) {
  return std::make_unique<SpinBudget>(std::max<int64_t>(1, sms / 2), std::max<int64_t>(1, sms - kSmsLeftByALoneLane));
}

int SpinBudget::AddLane() {
  lanes_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  steps_[next_lane_].began = steps_begun_;
  return next_lane_++;
}

void SpinBudget::RemoveLane(int lane) {
  lanes_.fetch_sub(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  steps_.erase(lane);
}

int64_t SpinBudget::BeginStep(int lane) {
  std::lock_guard<std::mutex> lock(mu_);
  LaneSteps& mine = steps_[lane];
  int64_t stepping = 1;
  for (const auto& [other, steps] : steps_) {
    if (other != lane && (steps.open || steps.began > mine.began)) ++stepping;
  }
  mine.open = true;
  mine.began = ++steps_begun_;
  return limit() / stepping;
}

void SpinBudget::EndStep(int lane) {
  std::lock_guard<std::mutex> lock(mu_);
  steps_[lane].open = false;
}

int64_t SpinBudget::CountOf(int64_t blocks, int64_t blocks_an_sm) const {
  if (lanes_.load(std::memory_order_relaxed) > 1 || blocks_an_sm <= 1) return blocks;
  const int64_t an_sm = blocks_an_sm * kLoneLaneWaves;
  return (blocks + an_sm - 1) / an_sm;
}

bool SpinBudget::TryTake(int64_t blocks) {
  const int64_t limit = this->limit();
  int64_t taken = taken_.load(std::memory_order_relaxed);
  do {
    if (taken + blocks > limit) return false;
  } while (!taken_.compare_exchange_weak(taken, taken + blocks, std::memory_order_relaxed));
  return true;
}

ChunkWait ChooseChunkWait(bool waits, bool lines, int64_t rows, int64_t launch_blocks, int64_t most_in_launch,
                          SpinBudget* budget, int64_t launch_blocks_an_sm) {
  ChunkWait wait;
  if (!waits) return wait;
  const int64_t counted = budget->CountOf(launch_blocks, launch_blocks_an_sm);
  if (counted <= most_in_launch && budget->TryTake(counted)) {
    wait.in_launch = true;
    wait.spinning = counted;
    return wait;
  }
  if (!lines) {
    wait.ahead_blocks = 1;
  } else if (budget->TryTake(rows)) {
    wait.ahead_blocks = rows;
    wait.spinning = rows;
    return wait;
  } else {
    wait.ahead_blocks = std::min(rows, kFewestPollingBlocks);
  }
  budget->Take(wait.ahead_blocks);
  wait.spinning = wait.ahead_blocks;
  return wait;
}

int FewestPairsPerBlock(int64_t pairs, int64_t most_in_launch, int64_t share, const SpinBudget& budget,
                        absl::FunctionRef<int64_t(int)> blocks_an_sm) {
  const int64_t room = std::min(most_in_launch, budget.left());
  for (const int64_t within : {std::min(room, share), room}) {
    for (int width : {1, 2, 4}) {
      if (budget.CountOf((pairs + width - 1) / width, blocks_an_sm(width)) <= within) return width;
    }
  }
  return 1;
}

}  // namespace lamina
